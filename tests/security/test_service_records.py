"""Records a Jupyter server reads when it starts, planted by another user in a run root they made
first: a private Podman service's owner record, which would have the orphan sweep
(engine/service/sweep.py) SIGKILL a process of the victim's, and a task record
(engine/service/taskrecords.py), which would list a task the victim never ran. Neither is trusted. The
same owner record written by the victim itself is acted on: the owner check is what refuses."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jupyter_podman_hpc.engine.base import processes
from jupyter_podman_hpc.engine.errors import PermissionDenied
from jupyter_podman_hpc.engine.service.sweep import sweep
from jupyter_podman_hpc.engine.service.taskrecords import DIRECTORY, TaskRecords
from jupyter_podman_hpc.engine.site.config import load_config
from tests.helpers.hpc import cleanup_hpc, make_hpc

GONE = "999999999:1"  # the owner token of a caller that died


def a_victim_process(socket: Path) -> subprocess.Popen:
    """A process of the victim's whose command line names ``socket``, as a private service's does
    (returned once it does: right after the fork it is still the test's own command line)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", f"unix://{socket}"])
    deadline = time.monotonic() + 30
    while f"unix://{socket}" not in processes.cmdline(process.pid):
        assert time.monotonic() < deadline, "the process never ran its command"
        time.sleep(0.01)
    return process


def owner_record(socket: Path, service: subprocess.Popen) -> str:
    return json.dumps(
        {"caller": GONE, "service": processes.owner_token(service.pid), "socket": str(socket), "started": time.time()}
    )


@pytest.fixture
def victim_processes():
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def test_a_planted_service_record_kills_nothing_and_the_victims_own_is_swept(victim, stack, plant, victim_processes):
    root = Path(victim.env["PODMANHPC_RUN_ROOT"])
    socket = root / "podman-hpc-op-1-evil.sock"
    target = a_victim_process(socket)
    victim_processes.append(target)
    plant(root / "podman-hpc-op-1-evil.owner", owner_record(socket, target), mode="0644")

    assert sweep(load_config(victim.env)) == []
    time.sleep(0.5)
    assert target.poll() is None, "the victim's process was killed on the attacker's record"

    # control: the same record, the victim's own, in the victim's own run root, is acted on
    own = make_hpc(stack, "records-control")
    try:
        own_root = Path(own.env["PODMANHPC_RUN_ROOT"])
        own_root.mkdir(mode=0o700)
        socket = own_root / "podman-hpc-op-2-own.sock"
        orphan = a_victim_process(socket)
        victim_processes.append(orphan)
        (own_root / "podman-hpc-op-2-own.owner").write_text(owner_record(socket, orphan))
        (own_root / "podman-hpc-op-2-own.owner").chmod(0o600)
        done = sweep(load_config(own.env))
    finally:
        cleanup_hpc(own)
    assert done and done[0].startswith("stopped the Podman service podman-hpc-op-2-own.sock"), done
    assert orphan.wait(10) == -9
    assert target.poll() is None


def test_a_planted_task_record_is_refused_in_one_line_and_never_listed(victim, plant):
    root = Path(victim.env["PODMANHPC_RUN_ROOT"])
    record = {
        "id": "0123456789ab",
        "kind": "build",
        "title": "build localhost/evil:1",
        "state": "running",
        "created": time.time(),
        "owner": GONE,
    }
    plant(root / DIRECTORY / "0123456789ab.json", json.dumps(record), mode="0644")

    with pytest.raises(PermissionDenied) as refused:
        TaskRecords.for_run_root(root)
    line = str(refused.value)
    assert "\n" not in line and "refusing to use" in line and "hpcoutsider" in line, line

    # the directory's owner is not all: a record the attacker could write in the victim's own is skipped
    own = TaskRecords.for_run_root(Path(victim.work) / "own-run-root")
    (own.directory / "0123456789ab.json").write_text(json.dumps(record))
    (own.directory / "0123456789ab.json").chmod(0o666)
    assert own.recover() == []
