"""A container kernel in a real `jupyter server`: installed with the CLI, listed at
/api/kernelspecs, started through /api/kernels, executing over the WebSocket, and
a kernel that cannot start answered with its message (what JupyterLab shows)."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import time
import uuid

import pytest

from tests.conftest import run

from .conftest import BIN, execute_over_websocket, free_port, http, stop, wait_http


@pytest.fixture
def server(kernel_site, tmp_path):
    """`jupyter server` on 127.0.0.1 with a token, in the kernel site's environment."""
    port, token = free_port(), secrets.token_hex(16)
    root = tmp_path / "notebooks"
    root.mkdir()
    log_path = tmp_path / "server.log"
    log = open(log_path, "wb")
    process = subprocess.Popen(
        [str(BIN / "jupyter-server"), "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", "--ServerApp.open_browser=False",
         f"--ServerApp.root_dir={root}"],
        env=kernel_site.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/api/status", 90, process, log_path, {"Authorization": f"token {token}"})
        yield base, token, log_path
    finally:
        stop(process)
        log.close()


def test_cli_kernelspec_runs_in_a_real_jupyter_server(kernel_site, server, stack):
    base, token, log_path = server
    # installed with the CLI into the user's Jupyter data dir (the default)
    installed = run([str(BIN / "jupyter"), "podman-hpc", "kernel", "install", stack.base_image,
                     "--name", "srv-base"], env=kernel_site.env)
    assert "installed kernel srv-base" in installed.stdout

    status, specs = http("GET", f"{base}/api/kernelspecs", token)
    assert status == 200, specs
    spec = specs["kernelspecs"]["srv-base"]
    assert spec["spec"]["display_name"] == f"Python (podman-hpc: {stack.base_image})"
    assert spec["spec"]["metadata"]["kernel_provisioner"]["config"]["image"] == stack.base_image
    assert "logo-svg" in spec["resources"]
    logo_status, _ = http("GET", base + spec["resources"]["logo-svg"], token)
    assert logo_status == 200

    started = time.monotonic()
    status, kernel = http("POST", f"{base}/api/kernels", token, {"name": "srv-base"})
    assert status == 201, kernel
    start_seconds = time.monotonic() - started
    kernel_id = kernel["id"]
    assert kernel_site.container_names(kernel_id) == [f"podman-hpc-kernel-{kernel_id}"]

    ws = f"ws://127.0.0.1:{base.rsplit(':', 1)[1]}/api/kernels/{kernel_id}/channels"
    reply, out = asyncio.run(execute_over_websocket(
        ws, token, "import os; print(open('/etc/os-release').read()); print('uid', os.getuid())"))
    assert reply["status"] == "ok", reply
    assert "VERSION_CODENAME=bookworm" in out

    status, _ = http("DELETE", f"{base}/api/kernels/{kernel_id}", token)
    assert status == 204
    assert kernel_site.containers(kernel_id) == []
    assert start_seconds < 30


def test_a_kernel_that_cannot_start_is_a_message_for_the_user(kernel_site, server, stack):
    base, token, _ = server
    image = f"{stack.registry}/jph/absent-{uuid.uuid4().hex[:6]}:1"
    run([str(BIN / "jupyter"), "podman-hpc", "kernel", "install", image, "--name", "srv-absent"],
        env=kernel_site.env)
    started = time.monotonic()
    # what JupyterLab does when a notebook opens with this kernel
    status, body = http("POST", f"{base}/api/sessions", token, {
        "path": "absent.ipynb", "name": "absent.ipynb", "type": "notebook", "kernel": {"name": "srv-absent"}})
    seconds = time.monotonic() - started
    assert status == 500, body
    assert body["message"].startswith(f"image {image} is not on this node"), body
    assert seconds < 15
    # what a client of the kernels API sees (jupyter_server hides other errors than HTTP ones)
    status, body = http("POST", f"{base}/api/kernels", token, {"name": "srv-absent"})
    assert status == 500 and body["message"].startswith(f"image {image} is not on this node"), body
    status, kernels = http("GET", f"{base}/api/kernels", token)
    assert status == 200 and kernels == []
