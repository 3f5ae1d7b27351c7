"""The server's task manager with its records on disk: tasks of a server that died are listed as
interrupted by the next one, and a server that stops interrupts (and records) its own."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from jupyter_podman_hpc.engine.base import processes
from jupyter_podman_hpc.engine.errors import EngineError
from jupyter_podman_hpc.engine.service.taskrecords import TaskRecord, TaskRecords
from jupyter_podman_hpc.server.tasks import TaskManager


@pytest.fixture
def records(tmp_path):
    return TaskRecords.for_run_root(tmp_path / "run")


def wait_state(task, states, timeout=10.0):
    deadline = time.monotonic() + timeout
    while task.state not in states:
        assert time.monotonic() < deadline, task.state
        time.sleep(0.02)


def test_a_running_task_is_recorded_and_its_record_removed_when_it_ends(records):
    manager = TaskManager(records=records)
    release = threading.Event()
    task = manager.start("pull", "pull localhost/a:1", lambda progress, cancel: release.wait(10) and {"id": "x"})
    wait_state(task, ("running",))
    deadline = time.monotonic() + 5  # the state is set, then written
    while [r.state for r in records.read_all()] != ["running"] and time.monotonic() < deadline:
        time.sleep(0.02)
    on_disk = records.read_all()
    assert [(r.id, r.state, r.owner) for r in on_disk] == [(task.id, "running", processes.owner_token())]
    release.set()
    wait_state(task, ("succeeded",))
    assert records.read_all() == []
    manager.shutdown(grace=1)


def test_the_next_manager_lists_a_dead_servers_running_task_as_interrupted(records):
    child = subprocess.Popen(["sleep", "30"])
    gone = processes.owner_token(child.pid)
    child.kill()
    child.wait()
    records.write(TaskRecord("abc123def456", "build", "build localhost/a:1", "running", time.time() - 5, gone))
    manager = TaskManager(records=records)
    listed = [t.as_dict() for t in manager.list()]
    assert [(t["id"], t["state"]) for t in listed] == [("abc123def456", "interrupted")]
    assert listed[0]["error"] == "build localhost/a:1 was interrupted: the server stopped while it ran; start it again"
    # its event stream ends with that state: a client streaming it does not wait forever
    task = manager.get("abc123def456")
    assert [(e.kind, e.data["state"]) for e in task.events] == [("state", "interrupted")]
    manager.shutdown(grace=1)


def test_a_stopping_server_cancels_its_tasks_and_records_them_as_interrupted(records):
    manager = TaskManager(records=records)
    started = threading.Event()

    def obedient(progress, cancel):
        started.set()
        cancel.wait(30)
        raise EngineError("the build of localhost/a:1 was cancelled")

    def stubborn(progress, cancel):
        time.sleep(3)
        return {"id": "late"}

    first = manager.start("build", "build localhost/a:1", obedient)
    second = manager.start("pull", "pull localhost/b:1", stubborn)
    started.wait(5)
    manager.shutdown(grace=0.5)
    assert (first.state, second.state) == ("interrupted", "interrupted")
    assert first.error == "build localhost/a:1 was interrupted: the server stopped while it ran; start it again"
    assert {r.id: r.state for r in records.read_all()} == {first.id: "interrupted", second.id: "interrupted"}
    time.sleep(3)  # the stubborn one ends later: its end does not overwrite the interruption
    assert second.state == "interrupted"
