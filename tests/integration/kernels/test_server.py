"""A container kernel in a real `jupyter server`: installed with the CLI, listed at
/api/kernelspecs, started through /api/kernels, executing over the WebSocket, and
a kernel that cannot start answered with its message (what JupyterLab shows)."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.helpers.commands import run
from tests.helpers.kernel_site import BIN
from tests.helpers.servers import http, jupyter_server, run_cell, start_kernel


@pytest.fixture
def server(kernel_site, tmp_path):
    """`jupyter server` on 127.0.0.1 with a token, in the kernel site's environment."""
    root = tmp_path / "notebooks"
    root.mkdir()
    log_path = tmp_path / "server.log"
    with jupyter_server(kernel_site, root, log_path) as (base, token, _):
        yield base, token, log_path


def test_cli_kernelspec_runs_in_a_real_jupyter_server(kernel_site, server, stack):
    base, token, log_path = server
    # installed with the CLI into the user's Jupyter data dir (the default)
    installed = run(
        [str(BIN / "jupyter"), "podman-hpc", "kernel", "install", stack.base_image, "--name", "srv-base"],
        env=kernel_site.env,
    )
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
    kernel_id = start_kernel(base, token, "srv-base", log_path)
    start_seconds = time.monotonic() - started
    assert kernel_site.container_names(kernel_id) == [f"podman-hpc-kernel-{kernel_id}"]

    out = run_cell(
        base, token, kernel_id, "import os; print(open('/etc/os-release').read()); print('uid', os.getuid())"
    )
    assert "VERSION_CODENAME=bookworm" in out

    status, _ = http("DELETE", f"{base}/api/kernels/{kernel_id}", token)
    assert status == 204
    assert kernel_site.containers(kernel_id) == []
    assert start_seconds < 30


def test_a_kernel_that_cannot_start_is_a_message_for_the_user(kernel_site, server, stack):
    base, token, _ = server
    image = f"{stack.registry}/jph/absent-{uuid.uuid4().hex[:6]}:1"
    run([str(BIN / "jupyter"), "podman-hpc", "kernel", "install", image, "--name", "srv-absent"], env=kernel_site.env)
    started = time.monotonic()
    # what JupyterLab does when a notebook opens with this kernel
    status, body = http(
        "POST",
        f"{base}/api/sessions",
        token,
        {"path": "absent.ipynb", "name": "absent.ipynb", "type": "notebook", "kernel": {"name": "srv-absent"}},
    )
    seconds = time.monotonic() - started
    assert status == 500, body
    assert body["message"].startswith(f"image {image} is not on this node"), body
    assert seconds < 15
    # what a client of the kernels API sees (jupyter_server hides other errors than HTTP ones)
    status, body = http("POST", f"{base}/api/kernels", token, {"name": "srv-absent"})
    assert status == 500 and body["message"].startswith(f"image {image} is not on this node"), body
    status, kernels = http("GET", f"{base}/api/kernels", token)
    assert status == 200 and kernels == []
