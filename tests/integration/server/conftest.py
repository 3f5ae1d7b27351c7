"""A real jupyter_server with our extension, in-process (pytest-jupyter), on the real stack."""

import asyncio
import json
import shutil

import pytest
from traitlets.config import Config
from pytest_jupyter.jupyter_core import *  # noqa: F401,F403 - its fixtures and async test support
from pytest_jupyter.jupyter_server import *  # noqa: F401,F403

from tests.integration.conftest import cleanup_hpc, make_hpc


@pytest.fixture
def server_hpc(stack, monkeypatch):
    """The server's engine environment: a private graph root and squashed store holding the tiny image."""
    hpc = make_hpc(stack, "server")
    hpc("pull", stack.tiny_image)
    hpc.wipe_local_storage()
    for key in ("PODMANHPC_GRAPH_ROOT", "PODMANHPC_RUN_ROOT", "PODMANHPC_CONFIG_HOME", "SQUASH_DIR"):
        monkeypatch.setenv(key, hpc.env[key])
    yield hpc
    cleanup_hpc(hpc)


@pytest.fixture
def job_root(stack):
    """Job directories must be on the shared scratch: the nodes write the logs there."""
    path = stack.work_dir("server-jobs")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def jp_server_config(jp_root_dir, job_root):
    return Config({
        "ServerApp": {"jpserver_extensions": {"jupyter_podman_hpc": True}},
        "PodmanHPC": {"max_nodes": 4, "job_root": str(job_root), "max_containerfile_bytes": 10_000},
    })


@pytest.fixture
def api(jp_fetch):
    """Call the podman-hpc API: (status, JSON body); errors do not raise."""
    async def call(method, *path, body=None, params=None, headers=None):
        kwargs = {"method": method, "raise_error": False, "params": params, "headers": headers}
        if body is not None:
            kwargs["body"] = body if isinstance(body, (bytes, str)) else json.dumps(body)
        elif method in ("POST", "PUT"):
            kwargs["body"] = "{}"
        response = await jp_fetch("podman-hpc", "api", *path, **kwargs)
        text = response.body.decode() if response.body else ""
        if response.headers.get("Content-Type", "").startswith("text/event-stream"):
            return response.code, text
        return response.code, (json.loads(text) if text else None)
    return call


async def finished(api, task, timeout=300):
    for _ in range(int(timeout / 0.5)):
        status, body = await api("GET", "tasks", task["id"])
        assert status == 200
        if body["state"] in ("succeeded", "failed", "cancelled"):
            return body
        await asyncio.sleep(0.5)
    raise AssertionError(f"task {task['id']} did not finish: {body}")


def events(stream: str) -> list[tuple[str, dict]]:
    found = []
    for block in stream.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        found.append((fields["event"], json.loads(fields["data"])))
    return found
