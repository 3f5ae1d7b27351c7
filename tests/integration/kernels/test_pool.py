"""Warm pools of container kernels in a real `jupyter server`.

A kernelspec installed with no pool size (the server's default, one) or with
`--pool 1` has a container started when the server starts; a session adopts
it (no container of its own), with its own connection file and key, the
notebook's directory and the server's variables; a replacement starts;
interrupt, restart and shutdown work; nothing is left when the server stops,
when it is SIGKILLed (watchdog, or the sweep of the next server), or when the
kernelspec is removed. A kernelspec installed while the server runs gets its
pool once its first kernel, started on demand, is up.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.helpers.commands import run
from tests.helpers.kernel_site import BIN
from tests.helpers.pools import install, open_notebook, pool_containers, wait_for
from tests.helpers.servers import execute_over_websocket, http, jupyter_server, processes_mentioning

pytestmark = pytest.mark.slow

PROBE = """\
import json, os
from ipykernel.kernelapp import IPKernelApp
app = IPKernelApp.instance()
print(json.dumps({"cwd": os.getcwd(), "session": os.environ.get("JPY_SESSION_NAME"),
                  "file": app.connection_file, "key": json.load(open(app.connection_file))["key"]}))
"""


def probe(base: str, token: str, kernel_id: str) -> dict:
    ws = f"ws://127.0.0.1:{base.rsplit(':', 1)[1]}/api/kernels/{kernel_id}/channels"
    reply, out = asyncio.run(execute_over_websocket(ws, token, PROBE))
    assert reply["status"] == "ok", reply
    return json.loads(out.strip().splitlines()[-1])


def test_a_pooled_kernel_is_like_one_started_on_demand(kernel_site, stack, tmp_path):
    install(kernel_site, stack, "pool-base", None)  # the server's default pool
    root = tmp_path / "notebooks"
    (root / "sub").mkdir(parents=True)
    runtime = Path(kernel_site.env["JUPYTER_RUNTIME_DIR"])
    with jupyter_server(kernel_site, root, tmp_path / "server.log") as (base, token, _):
        # started with the server, before any kernel
        [first] = wait_for("a pool container", lambda: pool_containers(kernel_site, "pool-base"), 60)
        kernel_id = open_notebook(base, token, "sub/nb.ipynb", "pool-base")
        assert kernel_site.container_names(kernel_id) == []  # no container of its own: it adopted one
        seen = probe(base, token, kernel_id)
        assert seen["cwd"] == str((root / "sub").resolve())
        assert seen["session"] and seen["session"].endswith("sub/nb.ipynb")
        host_file = runtime / f"kernel-{kernel_id}.json"
        assert seen["file"] == str(host_file) and seen["key"] == json.loads(host_file.read_text())["key"]
        # a replacement, adopted by the next notebook: a different kernel, its own key
        [second] = wait_for(
            "a replacement", lambda: [n for n in pool_containers(kernel_site, "pool-base") if n != first], 60
        )
        assert first in kernel_site.container_names()  # still running the first kernel
        other_id = open_notebook(base, token, "other.ipynb", "pool-base")
        other = probe(base, token, other_id)
        assert other["key"] != seen["key"] and other["cwd"] == str(root.resolve())

        # interrupt a running cell
        ws = f"ws://127.0.0.1:{base.rsplit(':', 1)[1]}/api/kernels/{kernel_id}/channels"

        async def interrupted():
            cell = asyncio.create_task(execute_over_websocket(ws, token, "import time; time.sleep(60)"))
            await asyncio.sleep(1.5)
            status, _ = await asyncio.to_thread(http, "POST", f"{base}/api/kernels/{kernel_id}/interrupt", token)
            assert status == 204
            return await asyncio.wait_for(cell, 30)

        reply, _ = asyncio.run(interrupted())
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
        # restart: the old container goes, the kernel answers again with the same connection file
        status, _ = http("POST", f"{base}/api/kernels/{kernel_id}/restart", token)
        assert status == 200
        wait_for(f"{first} to go", lambda: first not in kernel_site.container_names(), 30)
        assert probe(base, token, kernel_id)["key"] == seen["key"]
        for kernel in (kernel_id, other_id):
            status, _ = http("DELETE", f"{base}/api/kernels/{kernel}", token)
            assert status == 204
        assert second not in kernel_site.container_names()
    # the server stopped: no kernel, no pool container
    assert kernel_site.containers() == []


def test_a_kernelspec_installed_while_the_server_runs_gets_its_pool_after_its_first_kernel(
    kernel_site, stack, tmp_path
):
    root = tmp_path / "notebooks"
    root.mkdir()
    log = tmp_path / "server.log"
    with jupyter_server(kernel_site, root, log) as (base, token, _):
        install(kernel_site, stack, "pool-later", 1)
        first_id = open_notebook(base, token, "first.ipynb", "pool-later")
        # on demand, alone: the pool's container starts only once this kernel is up (they would share the cores)
        assert kernel_site.container_names(first_id) == [f"podman-hpc-kernel-{first_id}"]
        text = log.read_text()
        started = text.index(f"starting kernel {first_id} in podman-hpc-kernel-{first_id}")
        assert "kernel(s) of pool-later:" in text[started:] and "kernel(s) of pool-later:" not in text[:started], text[
            -3000:
        ]
        [pooled] = wait_for("a pool container", lambda: pool_containers(kernel_site, "pool-later"), 60)
        second_id = open_notebook(base, token, "second.ipynb", "pool-later")
        assert kernel_site.container_names(second_id) == []
        assert f"kernel {second_id} adopts pooled container {pooled} " in log.read_text()
    assert kernel_site.containers() == []


def test_pool_containers_die_with_the_server_and_the_kernelspec(kernel_site, stack, tmp_path):
    install(kernel_site, stack, "pool-gone", 1)
    root = tmp_path / "notebooks"
    root.mkdir()
    log = tmp_path / "server.log"
    # SIGKILL, watchdogs killed too, and a waiter that hangs (it would otherwise exit when its
    # stdin closes with the server): the next server's sweep removes the container
    with jupyter_server(kernel_site, root, log) as (_, _, process):
        [orphan] = wait_for("a pool container", lambda: pool_containers(kernel_site, "pool-gone"), 60)
        init = int(kernel_site.hpc("inspect", "--format", "{{.State.Pid}}", orphan).stdout)
        waiter = wait_for("the waiter", lambda: Path(f"/proc/{init}/task/{init}/children").read_text().split(), 30)
        os.kill(int(waiter[0]), signal.SIGSTOP)
        watchdogs = [
            pid
            for pid in processes_mentioning(orphan)
            if b"kernels.orphans" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        assert watchdogs
        for pid in watchdogs:
            os.kill(pid, signal.SIGKILL)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        time.sleep(2)
        assert orphan in kernel_site.container_names()
    with jupyter_server(kernel_site, root, log) as (_, _, process):
        wait_for(f"the sweep to remove {orphan}", lambda: orphan not in kernel_site.container_names(), 60)
        [pooled] = wait_for("a new pool container", lambda: pool_containers(kernel_site, "pool-gone"), 60)
        # removing the kernelspec closes its pool
        run([str(BIN / "jupyter"), "podman-hpc", "kernel", "remove", "pool-gone"], env=kernel_site.env)
        wait_for(f"{pooled} to go with its kernelspec", lambda: pooled not in kernel_site.container_names(), 30)
    install(kernel_site, stack, "pool-gone", 1)
    # SIGKILL: the container goes at once (its watchdog, and its waiter's stdin closes)
    with jupyter_server(kernel_site, root, log) as (_, _, process):
        [pooled] = wait_for("a pool container", lambda: pool_containers(kernel_site, "pool-gone"), 60)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        wait_for(f"the watchdog to remove {pooled}", lambda: pooled not in kernel_site.container_names(), 30)
    assert kernel_site.containers() == []
