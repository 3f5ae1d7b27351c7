"""A container's stray conmon and orphaned ``runc init``, on the real podman: what a per-process task's
reaper and a step monitor kill after ``podman rm`` (engine/processes.kill_conmon)."""

import os
import signal
import time
import uuid

from jupyter_podman_hpc.engine.base import processes


def conmon_of(name: str) -> int:
    """The pid of our conmon whose command line names container ``name`` (fails if none)."""
    found = [
        pid
        for pid in processes.parents()
        if processes.cmdline(pid)[:1] == ["/usr/bin/conmon"] and name in processes.cmdline(pid)
    ]
    assert len(found) == 1, found
    return found[0]


def test_kill_conmon_kills_a_container_held_between_create_and_start(squashed_tiny, stack):
    """``podman init`` leaves a container as a podman killed between ``runc create`` and ``runc start``
    does: conmon, and below it a ``runc init`` waiting for a start. Both go, and nothing else of ours."""
    hpc = squashed_tiny
    name = f"stray-{uuid.uuid4().hex[:8]}"
    hpc("create", "--name", name, stack.tiny_image, "sleep", "600")
    try:
        hpc("init", name)
        below = {" ".join(processes.cmdline(pid)[:2]) for pid in processes.descendants(conmon_of(name))}
        assert below == {"/usr/bin/runc init"}, below
        killed = processes.kill_conmon(name)
        assert len(killed) == 2, killed  # conmon and its runc init
        deadline = time.monotonic() + 10
        while any(processes.running(pid) for pid in killed):
            assert time.monotonic() < deadline, [processes.cmdline(pid) for pid in killed]
            time.sleep(0.1)
        assert processes.kill_conmon(name) == []
        assert processes.kill_conmon("no-such-container") == []
    finally:
        hpc("rm", "--force", "--time", "0", name, check=False)


def test_a_runc_init_whose_conmon_was_killed_goes_too(squashed_tiny, stack):
    """Once conmon is dead, nothing names the container: its ``runc init`` waits forever with pid 1 as its
    parent (the leak a stress run left). kill_conmon of any container ends it, as an orphan of the user."""
    hpc = squashed_tiny
    name = f"orphan-{uuid.uuid4().hex[:8]}"
    hpc("create", "--name", name, stack.tiny_image, "sleep", "600")
    try:
        hpc("init", name)
        conmon = conmon_of(name)
        [init] = processes.descendants(conmon)
        os.kill(conmon, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while processes.running(conmon):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert processes.running(init) and init in processes.orphaned_runc_inits()
        assert init in processes.kill_conmon("no-such-container")
        while processes.running(init):
            assert time.monotonic() < deadline + 10, processes.cmdline(init)
            time.sleep(0.1)
        assert init not in processes.orphaned_runc_inits()
    finally:
        hpc("rm", "--force", "--time", "0", name, check=False)
