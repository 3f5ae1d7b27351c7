"""A small record on disk of each running background task (a pull, a build, a squash).

A Jupyter server keeps its tasks in memory; one that is killed or restarted in
the middle of a build would leave the next server knowing nothing of it, and
the user watching a task that never ends. So each task's state is also written,
as it changes, to ``<run_root>/podman-hpc-tasks/<id>.json`` (a directory the
engine makes or verifies as the user's own, files written atomically, mode
0600), with the owner token of the process running it; a task that ends is
removed, unless it ended ``interrupted`` (its server stopped while it ran). The
next process to ``recover()`` them gets every task whose owner is gone and that
was queued, running or interrupted, as ``interrupted`` with one line saying so,
to list once: the records of owners that are gone are removed then. Records of
live owners (another server of the same user) are theirs and left alone. Only
regular files of the user's own that nobody else may write are read; the rest
are skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ..base import processes
from ..base.files import atomic_write, read_own_json
from ..base.private import private_dir

DIRECTORY = "podman-hpc-tasks"
INTERRUPTED = "interrupted"
UNFINISHED = ("queued", "running")
_ID = re.compile(r"^[0-9a-f]{6,32}$")
_MAX_BYTES = 64 << 10


@dataclass
class TaskRecord:
    id: str
    kind: str  # "pull", "build", "squash"
    title: str  # "build localhost/app:1"
    state: str  # "queued", "running", "succeeded", "failed", "cancelled", "interrupted"
    created: float
    owner: str  # owner token (``PID:START``) of the process running the task
    finished: float | None = None
    error: str | None = None


def interrupted_message(title: str) -> str:
    """The one line a user reads about a task (``title``) whose server went away while it ran."""
    return f"{title} was interrupted: the server stopped while it ran; start it again"


class TaskRecords:
    """The task records in one directory (``for_run_root``)."""

    def __init__(self, directory: Path):
        self.directory = directory

    @classmethod
    def for_run_root(cls, run_root: str | os.PathLike) -> TaskRecords:
        """The task records of the user whose run root this is (a private directory under it, made if
        missing)."""
        return cls(private_dir(Path(private_dir(run_root)) / DIRECTORY))

    def path(self, task_id: str) -> Path:
        """The file of task ``task_id``; ValueError when the id is not one we make (no path outside the
        directory)."""
        if not _ID.match(task_id):
            raise ValueError(f"not a task id: {task_id!r}")
        return self.directory / f"{task_id}.json"

    def write(self, record: TaskRecord) -> None:
        """Write the record, whole or not at all, readable by the user only."""
        atomic_write(self.path(record.id), json.dumps(asdict(record)) + "\n", 0o600)

    def remove(self, task_id: str) -> None:
        """Remove the record of ``task_id``; nothing if it is gone."""
        with contextlib.suppress(FileNotFoundError):
            self.path(task_id).unlink()

    def read_all(self) -> list[TaskRecord]:
        """Every trusted, well-formed record, newest first."""
        found = []
        for path in self.directory.glob("*.json"):
            record = _read(path)
            if record is not None:
                found.append(record)
        return sorted(found, key=lambda r: r.created, reverse=True)

    def recover(self, now: float | None = None) -> list[TaskRecord]:
        """The tasks that owners now gone left unfinished or interrupted, as interrupted, newest
        first, for the caller to list; every record of an owner that is gone is removed."""
        now = time.time() if now is None else now
        interrupted = []
        for record in self.read_all():
            if processes.owner_alive(record.owner):
                continue
            if record.state in UNFINISHED:
                record.state, record.finished = INTERRUPTED, now
                record.error = interrupted_message(record.title)
            if record.state == INTERRUPTED:
                interrupted.append(record)
            self.remove(record.id)
        return interrupted


def _read(path: Path) -> TaskRecord | None:
    data = read_own_json(path, _MAX_BYTES)
    try:
        names = {f.name for f in fields(TaskRecord)}
        record = TaskRecord(**{k: v for k, v in data.items() if k in names})
        texts = (record.id, record.kind, record.title, record.state, record.owner)
        if (
            not all(isinstance(text, str) for text in texts)
            or not isinstance(record.created, (int, float))
            or not _ID.match(record.id)
            or path.name != f"{record.id}.json"
        ):
            return None
        return record
    except (ValueError, TypeError, AttributeError):
        return None


__all__ = ["INTERRUPTED", "TaskRecord", "TaskRecords", "interrupted_message"]
