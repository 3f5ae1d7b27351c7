"""JupyterHub on the login node with examples/hub/jupyterhub_config.py, from the site
environment (the installed wheel): the "node" profile starts the user's server as a
Slurm job on one of the nodes (batchspawner's SlurmSpawner), whose container kernel runs
there, and from which a 2-node interactive cluster (`%podman_hpc cluster start --nodes 2`)
gets two of the other nodes (whole-node allocation: one node for the server, the rest for
its jobs); the "login" profile starts it on the host. Stopping the server cancels its job
and leaves no container on its node. The time from "start my server" to a kernel's first
reply is measured for both profiles in the same run (tests/artifacts/hub-start-times.json).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from tests.helpers.servers import execute_over_websocket, http

from .hub import install_kernel, server_jobs, start_hub, stop_hub, timings_note, wait_container_gone

pytestmark = pytest.mark.slow

TIMINGS = Path(__file__).resolve().parents[2] / "artifacts" / "hub-start-times.json"
KERNEL = "site-base"


@pytest.fixture
def hub(stack, squashed_base, site_venv, configurable_http_proxy):
    instance = start_hub(stack=stack, squashed=squashed_base, site_venv=site_venv, chp=configurable_http_proxy)
    # started on demand, so that its container is the kernel's own (the default pool on a node:
    # tests/browser/test_hub_nodes.py)
    install_kernel(instance, site_venv, stack.base_image, KERNEL, "Base image (site)", "--pool", "0")
    try:
        yield instance
    finally:
        stop_hub(instance)
        timings_note(instance, TIMINGS)


def _node_containers(hpc, node: str, job_id: str | None = None) -> list[str]:
    """Kernel containers of the test storage on ``node`` (inside the server's job if it runs)."""
    where = ["--jobid", job_id, "--overlap"] if job_id else ["--immediate=60"]
    out = hpc.srun(*where, "-N1", "-n1", "-w", node, "podman-hpc", "ps", "--all", "--format", "{{.Names}}").stdout
    return [name for name in out.split() if name.startswith("podman-hpc-kernel-")]


def _first_reply(hub, user_url: str, code: str) -> tuple[str, str, float]:
    """Start a kernel of KERNEL and run ``code``; (kernel id, its output, seconds to the reply)."""
    started = time.monotonic()
    status, kernel = http("POST", f"{user_url}/api/kernels", hub.token, {"name": KERNEL})
    assert status == 201, f"{kernel}\n{hub.log_tail()}"
    port = hub.url.rsplit(":", 1)[1]
    ws_url = f"ws://127.0.0.1:{port}/user/{hub.user}/api/kernels/{kernel['id']}/channels"
    reply, out = asyncio.run(execute_over_websocket(ws_url, hub.token, code, timeout=180))
    assert reply["status"] == "ok", reply
    return kernel["id"], out, time.monotonic() - started


def test_node_profile_runs_the_server_as_a_slurm_job(hub, squashed_base, stack, site_venv):
    started = time.monotonic()
    user_url = hub.start_server("node")
    server_ready = time.monotonic() - started
    jobs = server_jobs(hub.user)
    assert len(jobs) == 1 and jobs[0][1] == "RUNNING", jobs
    job_id, _, node = jobs[0]
    assert node in stack.nodes, jobs
    # the server runs from the site environment, not the checkout
    status, _ = http("GET", f"{user_url}/api/status", hub.token)
    assert status == 200
    status, specs = http("GET", f"{user_url}/api/kernelspecs", hub.token)
    assert status == 200 and specs["kernelspecs"][KERNEL]["spec"]["display_name"] == "Base image (site)", specs
    kernel_id, out, first_reply = _first_reply(
        hub, user_url, "import os, sys; print('os', open('/etc/os-release').read()); print('exe', sys.executable)"
    )
    assert "VERSION_CODENAME=bookworm" in out, out
    hub.timings.update(
        node_server_ready_s=round(server_ready, 2),
        node_first_reply_s=round(first_reply, 2),
        node_start_to_reply_s=round(time.monotonic() - started, 2),
    )
    # its container is on the job's node, in the node's own storage (its /tmp)
    assert _node_containers(squashed_base, node, job_id) == [f"podman-hpc-kernel-{kernel_id}"]
    assert f"podman-hpc-kernel-{kernel_id}" not in squashed_base("ps", "--all", "--format", "{{.Names}}").stdout
    # the server and the kernel's watcher run from the site environment, not the checkout
    # (the stack's nodes share one process table: ps shows every node's processes)
    ps = squashed_base.srun("--jobid", job_id, "--overlap", "-N1", "-n1", "ps", "-u", hub.user, "-o", "args=").stdout
    bin_ = f"{site_venv}/bin"
    assert (
        f"{bin_}/python {bin_}/batchspawner-singleuser {bin_}/jupyterhub-singleuser --ip=127.0.0.1" in ps.splitlines()
    ), ps
    watcher = f"{site_venv}/bin/python -m jupyter_podman_hpc.kernels.orphans "
    assert any(line.startswith(watcher) and f"podman-hpc-kernel-{kernel_id}" in line for line in ps.splitlines()), ps

    # from inside the server's job: a 2-node job (an interactive cluster) on the other nodes
    status, python = http("POST", f"{user_url}/api/kernels", hub.token, {"name": "python3"})
    assert status == 201, python
    port = hub.url.rsplit(":", 1)[1]
    ws_url = f"ws://127.0.0.1:{port}/user/{hub.user}/api/kernels/{python['id']}/channels"
    code = (
        "%load_ext jupyter_podman_hpc\n"
        f"cluster = %podman_hpc cluster start --nodes 2 --time 10 {stack.base_image}\n"
        "import os\n"
        "print('engine nodes', sorted(set(cluster.client()[:].apply_sync("
        "lambda: __import__('os').environ['SLURMD_NODENAME']))))\n"
        "%podman_hpc cluster stop\n"
    )
    reply, out = asyncio.run(execute_over_websocket(ws_url, hub.token, code, timeout=240))
    assert reply["status"] == "ok", f"{reply}\n{out}"
    assert "2/2 engines registered" in out and "Stopped cluster " in out, out
    engine_nodes = eval(out.split("engine nodes ", 1)[1].splitlines()[0])  # noqa: S307 - a list of str
    assert len(engine_nodes) == 2 and node not in engine_nodes and set(engine_nodes) <= set(stack.nodes), out

    hub.stop_server()
    deadline = time.monotonic() + 60
    while server_jobs(hub.user):
        assert time.monotonic() < deadline, f"the server's job is still queued: {server_jobs(hub.user)}"
        time.sleep(1)
    remaining = _node_containers(squashed_base, node)
    deadline = time.monotonic() + 30
    while remaining and time.monotonic() < deadline:
        time.sleep(2)
        remaining = _node_containers(squashed_base, node)
    assert remaining == [], remaining


def test_login_profile_runs_the_server_on_the_hub_host(hub, squashed_base, stack):
    started = time.monotonic()
    user_url = hub.start_server("login")
    server_ready = time.monotonic() - started
    assert server_jobs(hub.user) == []
    kernel_id, out, first_reply = _first_reply(hub, user_url, "print('os', open('/etc/os-release').read())")
    assert "VERSION_CODENAME=bookworm" in out, out
    hub.timings.update(
        login_server_ready_s=round(server_ready, 2),
        login_first_reply_s=round(first_reply, 2),
        login_start_to_reply_s=round(time.monotonic() - started, 2),
    )
    assert f"podman-hpc-kernel-{kernel_id}" in squashed_base("ps", "--all", "--format", "{{.Names}}").stdout
    hub.stop_server()
    wait_container_gone(
        squashed_base, f"podman-hpc-kernel-{kernel_id}", 60, "the login-node kernel's container outlived its server"
    )
    print(json.dumps(hub.timings))


def test_a_node_checks_out_with_infohpc(squashed_base, site_venv, stack):
    """docs/operators/site.md, "Checking a node": infohpc of the site environment, run on a node."""
    info = squashed_base.srun("-N1", f"{site_venv}/bin/podman-hpc", "infohpc").stdout
    assert info.startswith("podman-hpc version: "), info
    assert "in Slurm job " in info, info  # the read path's policy for a job on a node
    site_packages = next((site_venv / "lib").glob("python3*/site-packages"))
    assert f"modules ({site_packages}/jupyter_podman_hpc/engine/site/data/modules.d):" in info, info
    assert f"mount_program (default): {site_venv}/bin/podman-hpc-mount" in info, info
