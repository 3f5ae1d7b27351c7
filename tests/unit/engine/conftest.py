"""Fixtures of the engine's unit tests: what a sweep of killed monitors or tasks removes
(engine/run/stepmonitor.py, engine/run/perprocess.py). Their helpers are in tests/helpers
(squash_files.py, store_images.py, sweeps.py)."""

import pytest

from tests.helpers.sweeps import RemovalsPodman


@pytest.fixture
def removals(monkeypatch) -> RemovalsPodman:
    from jupyter_podman_hpc.engine.base import processes

    podman = RemovalsPodman()
    monkeypatch.setattr(processes, "kill_conmon", podman.killed.append)
    return podman
