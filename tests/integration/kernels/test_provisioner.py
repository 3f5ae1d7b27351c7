"""Container kernels through a real jupyter_client KernelManager on the stack.

Start a kernel in the base image (from the squashed store), run code in it,
interrupt a sleep, restart it into a fresh container, shut it down with
nothing left; fail fast for a missing image and an image without python;
and clean up after a server killed with SIGKILL (watchdog, and the sweep of
the next start).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from tornado import web

from jupyter_podman_hpc.kernels.provisioner import KernelStartError
from tests.helpers.kernel_clients import run, start
from tests.helpers.servers import processes_mentioning


def evaluate(kc, expression: str, timeout: float = 30) -> str:
    """The text/plain result of an expression (an execute_result comes before idle, always)."""
    results: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "execute_result":
            results.append(msg["content"]["data"]["text/plain"])

    reply = kc.execute_interactive(expression, timeout=timeout, output_hook=hook)
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(results)


def interrupt_sleep(km, kc) -> tuple[dict, float]:
    """Run time.sleep(1000), interrupt it once the kernel is busy with it; the reply and the delay."""
    # stop_on_error=False: else ipykernel aborts what comes right after the interrupted cell
    msg_id = kc.execute("import time; time.sleep(1000)", stop_on_error=False)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # wait until the cell runs
        msg = kc.get_iopub_msg(timeout=20)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "execute_input":
            break
    time.sleep(0.5)
    started = time.monotonic()
    km.interrupt_kernel()
    while True:
        reply = kc.get_shell_msg(timeout=10)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"], time.monotonic() - started


def container_of(site, km) -> dict:
    [container] = site.containers(km.kernel_id)
    return container


def test_kernel_lifecycle_in_the_base_image(kernel_site, stack, tmp_path):
    site = kernel_site
    site.install(stack.base_image, "base")
    work = tmp_path / "work"
    work.mkdir()
    km, kc, seconds = start("base", cwd=str(work))
    try:
        assert seconds < 30, f"the kernel took {seconds:.1f} s to start"
        container = container_of(site, km)
        assert container["Names"] == [f"podman-hpc-kernel-{km.kernel_id}"]
        assert container["State"] == "running"
        assert container["Labels"]["io.podman-hpc.kernel"] == km.kernel_id

        # the image's OS, inside a container, in the host's network, the user's files
        host_pidns = os.readlink("/proc/self/ns/pid")
        reply, out = run(
            kc,
            textwrap.dedent("""\
            import os, socket
            print(open("/etc/os-release").read())
            print("containerenv", os.path.exists("/run/.containerenv"))
            print("pidns", os.readlink("/proc/self/ns/pid"))
            print("init-started", open("/proc/1/stat").read().rpartition(")")[2].split()[19])
            print("cwd", os.getcwd())
            print("home", os.environ["HOME"])
            print("uid", os.getuid())
            open("written-by-kernel.txt", "w").write("hello")
            """),
        )
        assert reply["status"] == "ok", reply
        assert "VERSION_CODENAME=bookworm" in out
        assert "containerenv True" in out
        pidns = out.split("pidns ", 1)[1].split()[0]
        assert pidns != host_pidns
        init_started = int(out.split("init-started ", 1)[1].split()[0])
        assert f"cwd {work}" in out and f"home {os.environ['HOME']}" in out
        # from the squashed store: the container's root, which is the user on the host
        assert "uid 0" in out
        written = work / "written-by-kernel.txt"
        assert written.read_text() == "hello" and written.stat().st_uid == os.getuid()
        assert km.is_alive()

        # interrupt (message mode, as the kernelspecs we write say)
        reply, delay = interrupt_sleep(km, kc)
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
        assert delay < 5, f"the interrupt took {delay:.1f} s"
        assert evaluate(kc, "6 * 7") == "42"  # and the kernel goes on

        # restart: a fresh kernel in a fresh container
        old = container["Id"]
        evaluate(kc, "marker = 'old kernel'")
        started = time.monotonic()
        km.restart_kernel()
        kc.wait_for_ready(timeout=60)
        restart_seconds = time.monotonic() - started
        new = container_of(site, km)
        assert new["Id"] != old and new["State"] == "running"
        assert evaluate(kc, "'marker' in dir()") == "False"
        # a new container: its init started after the old one's
        assert int(evaluate(kc, "int(open('/proc/1/stat').read().rpartition(')')[2].split()[19])")) > init_started
        assert old not in [c["Id"] for c in site.containers()]
        assert restart_seconds < 40
    finally:
        kc.stop_channels()
        km.shutdown_kernel()
    # shutdown: nothing left, not even stopped containers or the watchdog
    assert site.containers(km.kernel_id) == []
    assert not km.is_alive()
    deadline = time.monotonic() + 5
    while processes_mentioning(f"podman-hpc-kernel-{km.kernel_id}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_mentioning(f"podman-hpc-kernel-{km.kernel_id}") == []


def test_signal_interrupt_mode_and_poll_follow_the_container(kernel_site, stack):
    site = kernel_site
    site.install(stack.base_image, "base-signal", interrupt_mode="signal")
    km, kc, _ = start("base-signal")
    try:
        reply, delay = interrupt_sleep(km, kc)  # SIGINT via `podman kill --signal` to catatonit
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
        assert delay < 5
        # the container dies behind Jupyter's back: poll() notices
        km.stop_restarter()
        name = container_of(site, km)["Names"][0]
        site.hpc("kill", name)
        deadline = time.monotonic() + 10
        while km.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not km.is_alive()
        site.wait_gone(name, 10)  # --rm
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert site.containers(km.kernel_id) == []


def assert_fails_fast(name: str, expected: str) -> KernelStartError:
    km = KernelManager(kernel_name=name, kernel_spec_manager=KernelSpecManager())
    started = time.monotonic()
    with pytest.raises(KernelStartError) as caught:
        km.start_kernel()
    seconds = time.monotonic() - started
    assert seconds < 15, f"failing took {seconds:.1f} s"
    assert expected in str(caught.value)
    assert not isinstance(caught.value, web.HTTPError)  # web types stay in the server extension
    return caught.value


def test_missing_image_fails_fast_with_a_message(kernel_site, stack):
    image = f"{stack.registry}/jph/not-there-{uuid.uuid4().hex[:6]}:1"
    kernel_site.install(image, "missing")
    error = assert_fails_fast("missing", f"image {image} is not on this node")
    assert "podman-hpc pull" in str(error)
    assert kernel_site.containers() == []


def test_image_without_ipykernel_fails_fast_with_a_message(tiny_site, stack):
    tiny_site.install(stack.tiny_image, "tiny")
    assert_fails_fast("tiny", f"image {stack.tiny_image} has no ipykernel: install it or choose another image")
    assert tiny_site.containers() == []


HOLDER = """\
import sys, time
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
km = KernelManager(kernel_name=sys.argv[1], kernel_spec_manager=KernelSpecManager())
km.start_kernel()
with open(sys.argv[2] + ".tmp", "w") as out:
    out.write(km.provisioner.container_name)
import os; os.rename(sys.argv[2] + ".tmp", sys.argv[2])
time.sleep(1000)
"""


def hold_kernel(site, name: str) -> tuple[subprocess.Popen, str]:
    """A process (a stand-in for a Jupyter server) holding a kernel; it and the container's name."""
    script = site.root / "holder.py"
    script.write_text(HOLDER)
    marker = site.root / f"container-{uuid.uuid4().hex[:6]}"
    log = open(site.root / "holder.log", "ab")
    process = subprocess.Popen(
        [sys.executable, str(script), name, str(marker)],
        env=site.env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not marker.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the kernel holder failed:\n{(site.root / 'holder.log').read_text()[-3000:]}")
        time.sleep(0.1)
    return process, marker.read_text()


def test_watchdog_removes_the_container_of_a_killed_server(kernel_site, stack):
    site = kernel_site
    site.install(stack.base_image, "base")
    holder, name = hold_kernel(site, "base")
    assert name in site.container_names()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    seconds = site.wait_gone(name, 10)
    assert seconds < 5, f"the orphan lived {seconds:.1f} s"


def test_watchdog_removes_the_container_when_a_job_end_signals_it_with_its_server(kernel_site, stack):
    """How Slurm ends a job whose server holds a kernel (scancel, time limit, the hub's Stop): SIGTERM to
    every process of the job's tree at once (the server, its ``podman run``, the watchdog), then SIGKILL to
    what is still in the tree after KillWait. conmon has left the tree, so only the watchdog can remove
    the container, and its removal can outlast KillWait (in CI it did: the server's own clean-up and
    ``podman run --rm`` hold the container's lock). Here the holder's tree stands for the job's and this
    test's process for slurmstepd, and KillWait is shorter than any removal. Only the holder's tree is
    signalled: the test process has other children (the session's JupyterLab, which the whole tree's
    SIGKILL once took down for every later test)."""
    site = kernel_site
    site.install(stack.base_image, "base")
    holder, name = hold_kernel(site, "base")
    watchdogs = [
        pid for pid in processes_mentioning(name) if b"kernels.orphans" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    assert len(watchdogs) == 1, watchdogs
    holder_process = psutil.Process(holder.pid)
    job = [holder_process, *holder_process.children(recursive=True)]  # the tree, seen before anything dies
    assert watchdogs[0] in [p.pid for p in job]  # as in a job: a descendant
    for process in job:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    time.sleep(0.3)  # KillWait
    for process in job:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()  # psutil checks the process is still the one seen (no reused pid)
    holder.wait()
    seconds = site.wait_gone(name, 20)
    assert seconds < 10, f"the orphan lived {seconds:.1f} s"


def test_next_start_sweeps_orphans_the_watchdog_missed(kernel_site, stack):
    site = kernel_site
    site.install(stack.base_image, "no-watchdog")
    site.set_config("no-watchdog", watchdog=False)
    site.install(stack.base_image, "base")
    holder, orphan = hold_kernel(site, "no-watchdog")
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    time.sleep(3)
    assert orphan in site.container_names()  # nothing removed it: a true orphan
    # the next start (a new process, as a restarted server would be) sweeps it
    started = time.monotonic()
    second, fresh = hold_kernel(site, "base")
    try:
        site.wait_gone(orphan, 10)
        seconds = time.monotonic() - started
        assert seconds < 15, f"the orphan was removed {seconds:.1f} s after the next start began"
        assert fresh in site.container_names()  # a live owner's kernel is kept
    finally:
        second.send_signal(signal.SIGKILL)
        second.wait()
    site.wait_gone(fresh, 10)


@pytest.mark.slow
def test_keep_id_when_the_image_is_in_node_local_storage(hpc, stack, tmp_path, monkeypatch):
    """From node-local layers the kernel runs as the user's uid (keep_id "auto"); from a squash file
    (the squashed store, or a pulled image, which is squashed too) it runs as the container's root,
    which is the user on the host."""
    from tests.helpers.kernel_site import KernelSite, remove_kernel_containers, site_env, use_env

    hpc("pull", stack.base_image)  # squashed, and still in the node's storage: read from the squash file
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Containerfile").write_text(f"FROM {stack.base_image}\nRUN echo built > /built\n")
    hpc("build", "-t", "localhost/tests/keep-id:1", context)  # only in the node's storage
    env = site_env(hpc, tmp_path)
    use_env(monkeypatch, env)
    site = KernelSite(hpc, tmp_path, env)
    site.install("localhost/tests/keep-id:1", "local")
    km, kc, _ = start("local", cwd=str(tmp_path))
    try:
        uid = evaluate(kc, "__import__('os').getuid()")
        assert uid == str(os.getuid())
        evaluate(kc, "open('by-keep-id.txt', 'w').write('x')")
        assert (tmp_path / "by-keep-id.txt").stat().st_uid == os.getuid()
    finally:
        kc.stop_channels()
        km.shutdown_kernel()
        remove_kernel_containers(hpc)


def test_a_front_can_sweep_without_starting_a_kernel(kernel_site, stack):
    """What a server extension calls at load: orphans go, live owners' kernels stay."""
    from jupyter_podman_hpc.kernels import orphans

    site = kernel_site
    site.install(stack.base_image, "no-watchdog")
    site.set_config("no-watchdog", watchdog=False)
    holder, orphan = hold_kernel(site, "no-watchdog")
    alive, kept = hold_kernel(site, "no-watchdog")
    try:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert orphans.sweep_environment(site.env) == [orphan]
        assert orphan not in site.container_names() and kept in site.container_names()
    finally:
        alive.send_signal(signal.SIGKILL)
        alive.wait()
