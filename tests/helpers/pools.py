"""Warm pools of kernel containers: a kernelspec with a pool installed with the CLI, the pool's
containers, a notebook opened on a server, and waiting for a condition."""

import json
import os
import time

import pytest

from jupyter_podman_hpc.kernels.orphans import POOL_LABEL
from tests.helpers.commands import run as run_command
from tests.helpers.kernel_site import BIN
from tests.helpers.servers import http


def pool_containers(site, kernel_name: str) -> list[str]:
    out = site.hpc("ps", "--all", "--filter", f"label={POOL_LABEL}={kernel_name}", "--format", "json").stdout
    return sorted(c["Names"][0] for c in json.loads(out or "[]") or [])


def wait_for(what, condition, timeout: float, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def install(site, stack, name: str, pool: int | None) -> None:
    """Install a kernelspec of the base image with the CLI; ``pool`` None: the server's default pool size."""
    size = ["--pool", str(pool)] if pool is not None else []
    run_command(
        [str(BIN / "jupyter"), "podman-hpc", "kernel", "install", stack.base_image, "--name", name, *size], env=site.env
    )


def open_notebook(base: str, token: str, path: str, kernel_name: str) -> str:
    status, session = http(
        "POST",
        f"{base}/api/sessions",
        token,
        {"path": path, "name": os.path.basename(path), "type": "notebook", "kernel": {"name": kernel_name}},
    )
    assert status == 201, session
    return session["kernel"]["id"]
