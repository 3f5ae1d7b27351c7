"""Our server extension in a real jupyter_server run in-process (pytest-jupyter): its
configuration, its API called through ``jp_fetch``, a task waited for, and an event stream read."""

import asyncio
import json

from traitlets.config import Config


def server_config(job_root) -> Config:
    """The server's configuration in the server tests (and the Jupyter fault tests): our extension,
    at most 4 nodes, job directories in ``job_root``, a small limit on a Containerfile's size."""
    return Config(
        {
            "ServerApp": {"jpserver_extensions": {"jupyter_podman_hpc": True}},
            "PodmanHPC": {"max_nodes": 4, "job_root": str(job_root), "max_containerfile_bytes": 10_000},
        }
    )


def jobs_server_config(jobs_root) -> Config:
    """The server's configuration for a test whose jobs the magic's kernel lists too (``jobs_root``);
    a module that wants it names it in its own ``jp_server_config``, the others keep the one above."""
    return Config(
        {"ServerApp": {"jpserver_extensions": {"jupyter_podman_hpc": True}}, "PodmanHPC": {"job_root": str(jobs_root)}}
    )


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
