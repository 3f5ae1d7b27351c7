"""Fixtures for tests on the real stack that only its tests use: podman-hpc 1.2.2, the upstream
tool, as a peer (``peer``, ``peer_home``). podman-hpc with private storage per test (``hpc``) and
the squashed stores are in tests/conftest.py, shared with the fault, attack and browser tests."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tests.helpers.commands import run
from tests.helpers.peer import Peer


@pytest.fixture(scope="module")
def peer(stack) -> Peer:
    try:
        found = Peer(
            bin=Path(os.environ["STACK_PEER_BIN"]),
            config=Path(os.environ["STACK_PEER_CONFIG"]),
            venv=Path(os.environ["STACK_PEER_VENV"]),
        )
    except KeyError:
        message = "the stack does not export the podman-hpc 1.2.2 peer (STACK_PEER_*): run `dev/stack up`"
        if os.environ.get("STACK_REQUIRED"):
            pytest.fail(message)
        pytest.skip(message)
    return found


@pytest.fixture
def peer_home():
    """Private graph root, run root and config home for the peer.

    Its defaults (/tmp/<uid>_hpc/...) are shared with every other podman-hpc
    call of the user; files in it belong to subordinate uids, hence the
    removal through `podman unshare`.
    """
    path = Path(tempfile.mkdtemp(prefix="peer-"))
    yield path
    run(["podman", "unshare", "rm", "-rf", str(path)], check=False)
