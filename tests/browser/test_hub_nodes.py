"""A user of the site's JupyterHub in a real browser (docs/operators/site.md): log in, pick the
compute-node profile, and on the server the Slurm job runs on a node (from the site
environment, the installed wheel):

- the Launcher lists the container kernels; one starts and runs a cell;
- `%podman_hpc run` works from a notebook, and a job `%podman_hpc submit` sends from there
  gets the variables its batch script exports (`--env`);
- a kernel of a kernelspec installed with no pool size (the server's default pool, one)
  adopts the container the server keeps started on its node (the other kernelspec has
  `--pool 0`: cold);
- "Run at scale" submits a 2-node job from inside the server's job, which runs on two other
  nodes and whose rank logs the Jobs section's logs viewer shows;
- "Stop My Server" on the hub's control panel cancels the job and leaves no container
  (kernel, pool or job's) on any node;
- then, in the same run, the login-node profile: the server on the hub's host, a container
  kernel there, and its container gone after Stop.

Written to tests/artifacts/hub-start-times.json: the time from "Start" on the spawn page
to the container kernel's first output, on a node and on the login node
(browser_{node,login}_start_to_output_s), and, on the
running server, from the Launcher card's click to the kernel connected and idle, and to a
first output, for a cold container kernel and a pooled one started one after the other
(browser_node_{cold,pooled}_kernel_ready_s, browser_node_{cold,pooled}_kernel_to_output_s;
the output times include a fixed 1 s wait for the page's own kernel handshake). The
server starts its pool when it starts, beside the first cold kernel. The test records them
and does not compare them: speed targets belong to the benchmarks (`make bench`).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.browser.lab import (
    RUN_BUTTON,
    check_rank_logs,
    get_json,
    open_dialog,
    open_path,
    run_at_scale_notebook,
    shape_job,
    submit_job,
    wait_for_job,
)
from tests.helpers.commands import run
from tests.helpers.servers import http
from tests.integration.site.hub import (
    install_kernel,
    server_jobs,
    start_hub,
    stop_hub,
    timings_note,
    wait_container_gone,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.integration]

TIMINGS = Path(__file__).resolve().parents[1] / "artifacts" / "hub-start-times.json"
DISPLAY = "Base image (site, node)"
POOLED = "Base image (site, node, pooled)"
NOTEBOOK = ".jp-NotebookPanel:visible"
OS_RELEASE = "print(open('/etc/os-release').read())"


@dataclass(frozen=True)
class UserServer:
    """The user's server behind the hub, addressed as the browser helpers address a Lab."""

    url: str  # ends in "/"
    token: str
    root: Path  # its root directory (c.Spawner.notebook_dir)


@pytest.fixture
def hub(stack, squashed_base, site_venv, configurable_http_proxy):
    instance = start_hub(stack=stack, squashed=squashed_base, site_venv=site_venv, chp=configurable_http_proxy)
    install_kernel(instance, site_venv, stack.base_image, "site-node", DISPLAY, "--pool", "0")  # the cold one
    install_kernel(instance, site_venv, stack.base_image, "site-node-pooled", POOLED)  # the server's default pool
    # the server's job directories ("Run at scale"): on the shared scratch, this test's own
    (instance.root / "config" / "jupyter_server_config.json").write_text(
        json.dumps({"PodmanHPC": {"job_root": str(instance.root / "jobs")}})
    )
    try:
        yield instance
    finally:
        stop_hub(instance)
        timings_note(instance, TIMINGS)


def _spawn(page, hub, profile: str, screenshot: Path | None = None) -> float:
    """On the spawn page: pick ``profile`` and start; once the Lab is up, return when Start was clicked."""
    page.wait_for_selector("select[name=profile]")
    page.select_option("select[name=profile]", profile)
    if screenshot is not None:
        page.screenshot(path=str(screenshot))
    started = time.monotonic()
    page.click("#spawn_form [type=submit]")
    page.wait_for_url(f"**/user/{hub.user}/lab**", timeout=300_000)
    page.wait_for_selector("#jupyterlab-splash", state="detached")
    return started


def _stop(page, hub) -> None:
    """Stop My Server on the hub's home page; return once the hub offers Start again."""
    page.goto(f"{hub.url}/hub/home", wait_until="domcontentloaded")
    page.click("#stop")
    page.wait_for_selector("#start", state="visible", timeout=120_000)


def _run_cell(page, code: str, expect: str, timeout: float = 180_000):
    """Type ``code`` into the current notebook's last cell, run it, wait for ``expect`` in its output."""
    editor = page.locator(f"{NOTEBOOK} .jp-Cell").last.locator(".cm-content")
    editor.click()
    page.keyboard.type(code)
    page.keyboard.press("Shift+Enter")
    output = page.locator(f"{NOTEBOOK} .jp-OutputArea-output", has_text=expect)
    output.first.wait_for(state="visible", timeout=timeout)
    return output.first.inner_text()


def _open_from_launcher(page, hub, label: str, timeout: float = 180) -> tuple[str, float, float]:
    """Open a notebook from the Launcher card ``label``; return once its kernel is connected
    and idle (a cell run before that is lost): (the kernel's id, when the card was clicked,
    when the kernel was first seen connected and idle)."""
    known = {kernel["id"] for kernel in _kernels(hub)}
    page.keyboard.press("Escape")  # out of a cell editor, which takes Ctrl+Shift+L for itself
    page.keyboard.press("Control+Shift+L")
    card = page.locator(".jp-LauncherCard:visible", has_text=label)
    card.first.wait_for(state="visible", timeout=60_000)
    clicked = time.monotonic()
    card.first.click()
    page.locator(f"{NOTEBOOK} .jp-Cell").first.wait_for(state="visible", timeout=60_000)
    deadline = time.monotonic() + timeout
    while not (
        new := [
            kernel
            for kernel in _kernels(hub)
            if kernel["id"] not in known and kernel["connections"] > 0 and kernel["execution_state"] == "idle"
        ]
    ):
        assert time.monotonic() < deadline, f"no connected kernel of {label}: {_kernels(hub)}"
        time.sleep(0.25)
    ready = time.monotonic()
    page.wait_for_timeout(1000)  # the page's own kernel-ready handshake
    return new[0]["id"], clicked, ready


def _kernel_to_output(page, hub, label: str) -> tuple[str, float, float]:
    """A kernel of ``label`` from the Launcher runs a cell: (its id, seconds from the click to the
    kernel connected and idle, seconds from the click to the cell's output)."""
    kernel_id, clicked, ready = _open_from_launcher(page, hub, label)
    out = _run_cell(page, OS_RELEASE, "VERSION_CODENAME=bookworm")
    assert "bookworm" in out
    return kernel_id, round(ready - clicked, 2), round(time.monotonic() - clicked, 2)


def _kernels(hub) -> list[dict]:
    status, kernels = http("GET", f"{hub.url}/user/{hub.user}/api/kernels", hub.token)
    assert status == 200, kernels
    return kernels


def _node_containers(hpc, node: str) -> list[str]:
    # the node may go to another job first on a shared stack: wait a while for it
    out = hpc.srun(
        "--immediate=180", "-N1", "-n1", "-w", node, "podman-hpc", "ps", "--all", "--format", "{{.Names}}"
    ).stdout
    return [name for name in out.split() if name.startswith("podman-hpc-")]


def _node_containers_in_job(hpc, node: str, job_id: str) -> list[str]:
    out = hpc.srun(
        "--jobid", job_id, "--overlap", "-N1", "-n1", "-w", node, "podman-hpc", "ps", "--all", "--format", "{{.Names}}"
    ).stdout
    return out.split()


def _no_containers_left(hpc, nodes, within: float = 30) -> None:
    deadline = time.monotonic() + within
    left = {node: _node_containers(hpc, node) for node in nodes}
    while any(left.values()) and time.monotonic() < deadline:
        time.sleep(2)
        left = {node: _node_containers(hpc, node) for node in nodes}
    assert not any(left.values()), f"containers left on the nodes: {left}\n" + "\n".join(
        hpc.srun(
            "-N1",
            "-n1",
            "-w",
            node,
            "sh",
            "-c",
            "podman-hpc ps --all --format '{{.Names}} {{.Status}}'; ps -u \"$(id -u)\" -o pid,ppid,etime,args",
            check=False,
        ).stdout
        for node, names in left.items()
        if names
    )


def _server_log(job_id: str) -> str:
    """The single-user server's log: its job's output, which the example's batch script writes to $HOME."""
    return (Path.home() / f".jupyterhub-slurm-{job_id}.log").read_text(errors="replace")


@pytest.mark.timeout(900)
def test_server_on_a_node_from_the_browser(hub, page, console, artifacts, stack, squashed_base):
    page.set_default_timeout(60_000)
    page.goto(f"{hub.url}/hub/login", wait_until="domcontentloaded")
    page.fill("#username_input", hub.user)
    page.fill("#password_input", hub.password)
    page.click("#login_submit")
    # the profiles: compute node or login node
    started = _spawn(page, hub, "node", screenshot=artifacts / "hub-spawn-profiles.png")
    jobs = server_jobs(hub.user)
    assert len(jobs) == 1 and jobs[0][1] == "RUNNING" and jobs[0][2] in stack.nodes, jobs
    job_id, _, node = jobs[0]
    server = UserServer(f"{hub.url}/user/{hub.user}/", hub.token, hub.root / "notebooks")

    # the Launcher lists the container kernel; it starts on the node and runs a cell
    _open_from_launcher(page, hub, DISPLAY)
    out = _run_cell(page, OS_RELEASE, "VERSION_CODENAME=bookworm")
    hub.timings["browser_node_start_to_output_s"] = round(time.monotonic() - started, 2)
    assert "bookworm" in out
    assert [
        name for name in _node_containers_in_job(squashed_base, node, job_id) if name.startswith("podman-hpc-kernel-")
    ], "no kernel container on the server's node"
    page.screenshot(path=str(artifacts / "hub-node-container-kernel.png"))

    # the magics, from the site environment's Python kernel on the node
    _open_from_launcher(page, hub, "Python 3 (ipykernel)")
    out = _run_cell(
        page,
        "%load_ext jupyter_podman_hpc\n"
        f"%podman_hpc run --rm {stack.base_image} sh -c 'echo from-$(cat /etc/debian_version)'",
        "from-12",
    )
    assert "from-12" in out, out
    page.screenshot(path=str(artifacts / "hub-node-magic-run.png"))
    # a job submitted from there gets what its batch script exports (--env): the server's own job
    # must not hand it its Slurm variables (its SLURM_EXPORT_ENV would let only the hub's list through)
    try:
        out = _run_cell(
            page,
            f"job = %podman_hpc submit --time 5 --env PROBE=from-the-node {stack.base_image} "
            "printenv PROBE\nprint('probe:', job.wait(timeout=300).state, job.logs())\n"
            "import shutil; shutil.rmtree(job.directory)",
            "probe:",
            timeout=360_000,
        )
    finally:
        for submitted in re.findall(r"Submitted job (\d+)", page.locator(NOTEBOOK).inner_text()):
            run(["scancel", submitted], check=False)  # a no-op once it ended
    assert "probe: COMPLETED {0: 'from-the-node\\n'}" in out, out

    # the pooled kernelspec: the server keeps one container started on its node (since it
    # started); a kernel of it adopts that container. A cold kernel just before, for comparison.
    deadline = time.monotonic() + 120
    while not (
        pooled := [
            name for name in _node_containers_in_job(squashed_base, node, job_id) if name.startswith("podman-hpc-pool-")
        ]
    ):
        assert time.monotonic() < deadline, f"no pool container on the server's node:\n{_server_log(job_id)[-3000:]}"
        time.sleep(2)
    _, cold_ready, cold = _kernel_to_output(page, hub, DISPLAY)
    kernel_id, warm_ready, warm = _kernel_to_output(page, hub, POOLED)
    hub.timings.update(
        browser_node_cold_kernel_ready_s=cold_ready,
        browser_node_cold_kernel_to_output_s=cold,
        browser_node_pooled_kernel_ready_s=warm_ready,
        browser_node_pooled_kernel_to_output_s=warm,
    )
    print(
        f"on node {node}, from the Launcher click: cold kernel idle {cold_ready} s, output {cold} s; "
        f"pooled kernel idle {warm_ready} s, output {warm} s"
    )
    assert f"kernel {kernel_id} adopts pooled container {pooled[0]} " in _server_log(job_id), (
        f"the pooled kernel {kernel_id} did not adopt {pooled}:\n{_server_log(job_id)[-3000:]}"
    )
    page.screenshot(path=str(artifacts / "hub-node-pooled-kernel.png"))

    # Run at scale from inside the server's job: 2 nodes, the other ones (whole-node allocation)
    _run_at_scale(page, server, stack, node, artifacts)

    # Stop My Server on the control panel: the job goes, and every container with it
    _stop(page, hub)
    deadline = time.monotonic() + 60
    while server_jobs(hub.user):
        assert time.monotonic() < deadline, (
            f"the server's job outlived Stop My Server: {server_jobs(hub.user)}\n{hub.log_tail()}"
        )
        time.sleep(1)
    # nor on any other node (the submitted jobs' nodes; looked at now: while the server held its
    # node, a pending job of all nodes on a shared stack could keep the others from a new allocation)
    _no_containers_left(squashed_base, stack.nodes)
    page.screenshot(path=str(artifacts / "hub-node-stopped.png"))

    # the login-node profile in the same run, for comparison: the server on the hub's host. The Lab
    # would restore the node server's notebooks (its saved workspace) and their kernels: a first
    # login's empty Lab instead, so the time is a fresh user's
    shutil.rmtree(hub.root / "config" / "lab" / "workspaces", ignore_errors=True)
    page.click("#start")
    started = _spawn(page, hub, "login")
    assert server_jobs(hub.user) == []
    kernel_id, _, _ = _open_from_launcher(page, hub, DISPLAY)
    assert "bookworm" in _run_cell(page, OS_RELEASE, "VERSION_CODENAME=bookworm")
    hub.timings["browser_login_start_to_output_s"] = round(time.monotonic() - started, 2)
    print(
        f"from Start to a container kernel's output: node {hub.timings['browser_node_start_to_output_s']} s, "
        f"login node {hub.timings['browser_login_start_to_output_s']} s"
    )
    _stop(page, hub)
    wait_container_gone(
        squashed_base, f"podman-hpc-kernel-{kernel_id}", 30, "the login-node kernel's container outlived its server"
    )


def _run_at_scale(page, server: UserServer, stack, server_node: str, artifacts: Path) -> None:
    """Submit a notebook on 2 nodes x 1 task from the server's Lab; it completes on two other
    nodes, and its rank logs show in the logs viewer."""
    name = run_at_scale_notebook(server.root)
    open_path(page, name)
    page.locator(RUN_BUTTON).first.wait_for(state="visible", timeout=60_000)
    dialog = open_dialog(page)
    shape_job(dialog, stack.base_image, nodes=2, tasks_per_node=1)
    _, job_id = submit_job(page, dialog)
    try:
        completed = wait_for_job(page, server, job_id)
        assert completed.locator(".jp-PodmanHpc-jobExit").inner_text() == "exit 0"
        check_rank_logs(page, completed, job_id, ranks=2)
        page.screenshot(path=str(artifacts / "hub-node-run-at-scale-logs.png"))
        nodes = get_json(server, f"podman-hpc/api/jobs/{job_id}")["status"]["nodes"]
        assert len(nodes) == 2 and server_node not in nodes and set(nodes) <= set(stack.nodes), nodes
    finally:
        run(["scancel", job_id], check=False)  # a no-op once it ended
