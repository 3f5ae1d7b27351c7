"""The REST API and a squashed store the server's user may read but not write (a project
store another member owns, read-only for the group): listed, and writes refused with 403."""

import os
import uuid
from pathlib import Path

import pytest

from tests.helpers.commands import run
from tests.helpers.hpc import cleanup_hpc, make_hpc


@pytest.fixture
def read_only_store(stack, monkeypatch):
    """Member B's project store (mode 2750) holding the tiny image; the server's SQUASH_DIR."""
    owner = make_hpc(stack, "owner", os.environ["STACK_USER2"])
    server = make_hpc(stack, "server-ro")
    path = Path(os.environ["STACK_PROJECT_DIR"]) / f"ro-{uuid.uuid4().hex[:8]}"
    try:
        owner.sh("mkdir", "-m", "2750", path)
        owner("--squash-dir", path, "pull", stack.tiny_image)
        for key in ("PODMANHPC_GRAPH_ROOT", "PODMANHPC_RUN_ROOT", "PODMANHPC_CONFIG_HOME"):
            monkeypatch.setenv(key, server.env[key])
        monkeypatch.setenv("SQUASH_DIR", str(path))
        yield path
    finally:
        owner.sh("rm", "-rf", path, check=False)
        cleanup_hpc(server)
        cleanup_hpc(owner)


async def test_writes_into_a_store_the_user_cannot_write_are_403(api, read_only_store, stack):
    status, body = await api("GET", "images")
    assert status == 200
    tiny = next(i for i in body["images"] if stack.tiny_image in i["names"])
    assert tiny["store"] == str(read_only_store) and tiny["squashed"] and not tiny["local"]

    expected = f"cannot write to the image store {read_only_store}: "
    for method, path, payload in (
        ("POST", ("images", "squash"), {"image": stack.tiny_image}),
        ("POST", ("images", "pull"), {"image": stack.tiny_image}),
        ("DELETE", ("images", "squashed", stack.tiny_image), None),
    ):
        status, body = await api(method, *path, body=payload)
        assert status == 403, (path, status, body)
        assert body["message"].startswith(expected) and "only its owner" in body["message"], body
    status, body = await api("GET", "tasks")
    assert status == 200 and body["tasks"] == []  # nothing was started
    assert run(["ls", f"{read_only_store}/overlay/l"]).stdout.count(".squash") == 1
