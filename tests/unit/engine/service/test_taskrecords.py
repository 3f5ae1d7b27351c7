"""The task records: written atomically and owner-only, read only when trusted, and a dead
owner's unfinished tasks recovered as interrupted (real processes as owners, no podman)."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from jupyter_podman_hpc.engine.base import processes
from jupyter_podman_hpc.engine.errors import EngineError
from jupyter_podman_hpc.engine.service.taskrecords import INTERRUPTED, TaskRecord, TaskRecords, interrupted_message


def dead_owner() -> str:
    """The owner token of a process that has ended."""
    child = subprocess.Popen(["sleep", "30"])
    token = processes.owner_token(child.pid)
    child.kill()
    child.wait()
    return token


def record(task_id: str, owner: str, state: str = "running", **extra) -> TaskRecord:
    return TaskRecord(
        task_id, "build", f"build localhost/app:{task_id}", state, extra.pop("created", time.time()), owner, **extra
    )


@pytest.fixture
def records(tmp_path):
    return TaskRecords.for_run_root(tmp_path / "run")


def test_a_record_is_an_owner_only_file_in_a_private_directory(records, tmp_path):
    records.write(record("abc123", processes.owner_token()))
    path = tmp_path / "run" / "podman-hpc-tasks" / "abc123.json"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    assert json.loads(path.read_text())["state"] == "running"
    assert [p.name for p in path.parent.iterdir()] == ["abc123.json"]  # no temporary file left


def test_a_dead_owners_unfinished_tasks_are_interrupted_with_one_line_and_a_live_owners_are_not(records):
    gone = dead_owner()
    records.write(record("aaa111", gone, "running"))
    records.write(record("bbb222", gone, "queued"))
    records.write(record("ccc333", gone, INTERRUPTED, finished=time.time(), error="stopped by SIGTERM"))
    records.write(record("ddd444", gone, "failed", finished=time.time(), error="cannot pull x: no such image"))
    records.write(record("eee555", processes.owner_token(), "running"))  # another live server's

    recovered = {r.id: r for r in records.recover()}
    assert set(recovered) == {"aaa111", "bbb222", "ccc333"}
    running = recovered["aaa111"]
    assert running.state == INTERRUPTED and running.finished is not None
    assert (
        running.error == "build localhost/app:aaa111 was interrupted: the server stopped while it ran; start it again"
    )
    assert len(running.error.splitlines()) == 1
    assert recovered["bbb222"].state == INTERRUPTED
    assert recovered["ccc333"].error == "stopped by SIGTERM"  # as its server recorded it
    # listed once: the dead owners' records are gone, the live one's is untouched
    assert [(r.id, r.state) for r in records.read_all()] == [("eee555", "running")]
    assert records.recover() == []


@pytest.mark.parametrize("spoil", ["group-writable", "symlink", "garbage", "wrong-name", "wrong-types"])
def test_records_that_cannot_be_trusted_are_skipped(records, tmp_path, spoil):
    gone = dead_owner()
    records.write(record("aaa111", gone))
    path = records.path("aaa111")
    if spoil == "group-writable":
        os.chmod(path, 0o620)
    elif spoil == "symlink":
        target = tmp_path / "elsewhere.json"
        path.rename(target)
        path.symlink_to(target)
    elif spoil == "garbage":
        path.write_text("{not json")
    elif spoil == "wrong-name":
        path.rename(records.path("bbb222"))
    else:
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "created": "yesterday"}))
    assert records.read_all() == []
    assert records.recover() == []


def test_a_task_id_cannot_name_a_path_outside_the_directory(records):
    with pytest.raises(ValueError):
        records.path("../../etc/passwd")


def test_a_run_root_others_may_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(EngineError, match="others may have written into it"):
        TaskRecords.for_run_root(shared)


def test_the_message_names_the_task():
    assert interrupted_message(record("abc123", "1:0").title).startswith("build localhost/app:abc123 was interrupted")
