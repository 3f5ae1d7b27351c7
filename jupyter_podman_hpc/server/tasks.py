"""Background tasks of the server (pull, build, squash): state, progress, logs, events.

A task runs an engine call in a worker thread. Everything it reports goes
into its record (state, last progress, last log lines, result, error) and
into a numbered event list that clients stream and resume from (after a
browser reload, with Last-Event-ID). Tasks live as long as the server, and
their state also in the user's task records (``engine.service.taskrecords``): a server
that starts lists the tasks of servers that died, those that were still
running as ``interrupted``. A server stopped by a signal (SIGTERM) cancels its
tasks first and records them as interrupted (``shutdown``).
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..engine.base.processes import owner_token
from ..engine.errors import EngineError
from ..engine.progress import Progress
from ..engine.service.rest import stop_private_services
from ..engine.service.taskrecords import INTERRUPTED, TaskRecord, TaskRecords, interrupted_message

LOG_LINES = 200
MAX_EVENTS = 5000
FINISHED = ("succeeded", "failed", "cancelled", INTERRUPTED)
SHUTDOWN_GRACE = 20.0  # seconds a stopping server gives its cancelled tasks to end

# What a task runs: fn(progress_callback, cancel_event) -> JSON-able result.
Work = Callable[[Callable[[Progress], None], threading.Event], Any]


@dataclass
class Event:
    id: int
    kind: str  # "progress", "log", "state"
    data: dict


@dataclass
class Task:
    id: str
    kind: str
    title: str
    state: str = "queued"
    created: float = field(default_factory=time.time)
    finished: float | None = None
    progress: dict | None = None
    log: deque = field(default_factory=lambda: deque(maxlen=LOG_LINES))
    result: Any = None
    error: str | None = None
    cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    events: list[Event] = field(default_factory=list, repr=False)
    first_event: int = 0  # events before this one were dropped (a very long log)

    def as_dict(self, log_lines: int = 20) -> dict:
        """The task as the API shows it, with the last ``log_lines`` lines of its log."""
        return {
            "id": self.id,
            "kind": self.kind,
            "title": self.title,
            "state": self.state,
            "created": self.created,
            "finished": self.finished,
            "progress": self.progress,
            "log": list(self.log)[-log_lines:],
            "result": self.result,
            "error": self.error,
        }


class TaskManager:
    """Starts tasks, records what they report and wakes up the clients streaming their events."""

    def __init__(self, workers: int = 4, log=None, records: TaskRecords | None = None):
        self.tasks: dict[str, Task] = {}
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="podman-hpc-task")
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        self._log = log
        self._records = records
        self._owner = owner_token()
        self._stopping = False
        if records is not None:
            self._adopt(records)

    def _adopt(self, records: TaskRecords) -> None:
        """The tasks of servers that are gone, as they ended (or ``interrupted``)."""
        try:
            previous = records.recover()
        except OSError as err:
            self._warn("cannot read the task records of earlier servers: %s", err)
            return
        for record in previous:
            task = Task(
                id=record.id,
                kind=record.kind,
                title=record.title,
                state=record.state,
                created=record.created,
                finished=record.finished,
                error=record.error,
            )
            if record.error:
                task.log.append(record.error)
            task.events.append(Event(0, "state", {"state": task.state, "result": None, "error": task.error}))
            self.tasks[task.id] = task

    def start(self, kind: str, title: str, work: Work) -> Task:
        """Start ``work`` in the background as a new task of ``kind``, recorded and announced at once; the
        task (queued)."""
        task = Task(id=uuid.uuid4().hex[:12], kind=kind, title=title)
        with self._lock:
            self.tasks[task.id] = task
        self._emit(task, "state", {"state": task.state})
        self._persist(task)
        self._executor.submit(self._run, task, work)
        return task

    def get(self, task_id: str) -> Task | None:
        """The task ``task_id``, or None."""
        return self.tasks.get(task_id)

    def list(self) -> list[Task]:
        """Every task of this server, newest first."""
        return sorted(self.tasks.values(), key=lambda t: t.created, reverse=True)

    def cancel(self, task: Task) -> None:
        """Ask ``task`` to stop: its work sees the cancel event; a task still queued ends now as cancelled."""
        task.cancel.set()
        if task.state == "queued":
            self._finish(task, "cancelled", error="cancelled before it started")

    # --- the worker side ------------------------------------------------------

    def _run(self, task: Task, work: Work) -> None:
        if task.state != "queued":
            return
        self._set_state(task, "running")

        def report(event: Progress) -> None:
            if event.log:
                task.log.append(event.log)
                self._emit(task, "log", {"line": event.log})
            if event.message or event.current is not None:
                task.progress = {**event.as_dict(), "fraction": event.fraction}
                task.progress.pop("log", None)
                self._emit(task, "progress", task.progress)

        try:
            result = work(report, task.cancel)
        except EngineError as err:
            if self._stopping:
                self._interrupt(task)
            else:
                self._finish(task, "cancelled" if task.cancel.is_set() else "failed", error=str(err))
        except Exception as err:  # noqa: BLE001 - a task must always end, with a message
            if self._log:
                self._log.error("podman-hpc task %s failed:\n%s", task.id, traceback.format_exc())
            self._finish(task, "failed", error=f"{type(err).__name__}: {err}")
        else:
            cancelled = task.cancel.is_set() and not self._stopping  # a server's stop does not undo a result
            self._finish(task, "cancelled" if cancelled else "succeeded", result=result)

    def _set_state(self, task: Task, state: str) -> None:
        task.state = state
        self._emit(task, "state", {"state": state})
        self._persist(task)

    def _interrupt(self, task: Task) -> None:
        self._finish(task, INTERRUPTED, error=interrupted_message(task.title))

    def _finish(self, task: Task, state: str, *, result: Any = None, error: str | None = None) -> None:
        if task.state in FINISHED:
            return
        task.result, task.error, task.finished = result, error, time.time()
        if error:
            task.log.append(error)
        task.state = state
        self._emit(task, "state", {"state": state, "result": result, "error": error})
        self._persist(task)

    def _persist(self, task: Task) -> None:
        """The task's state in its record, removed once it ended but interrupted (a failure to
        write is logged, the task goes on)."""
        if self._records is None:
            return
        try:
            if task.state in FINISHED and task.state != INTERRUPTED:
                self._records.remove(task.id)
                return
            self._records.write(
                TaskRecord(
                    task.id, task.kind, task.title, task.state, task.created, self._owner, task.finished, task.error
                )
            )
        except OSError as err:
            self._warn("cannot record the state of task %s: %s", task.id, err)

    def _warn(self, message: str, *args) -> None:
        if self._log:
            self._log.warning("podman-hpc: " + message, *args)

    def _emit(self, task: Task, kind: str, data: dict) -> None:
        with self._lock:
            number = task.first_event + len(task.events)
            task.events.append(Event(number, kind, data))
            if len(task.events) > MAX_EVENTS:
                drop = len(task.events) - MAX_EVENTS
                del task.events[:drop]
                task.first_event += drop
            waiters = self._waiters.pop(task.id, [])
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    # --- the client side ------------------------------------------------------

    async def events_after(self, task: Task, last: int) -> list[Event]:
        """Events numbered above ``last``; waits for the next one if there is none yet."""
        while True:
            with self._lock:
                fresh = [e for e in task.events if e.id > last]
                if fresh or task.state in FINISHED:
                    return fresh
                wake = asyncio.Event()
                self._waiters.setdefault(task.id, []).append((asyncio.get_running_loop(), wake))
            await wake.wait()

    def shutdown(self, grace: float = SHUTDOWN_GRACE) -> None:
        """The server is stopping: cancel every task (a build's RUN step is killed, a pull's
        connection cut, their Podman services stopped), give them ``grace`` seconds to end, and
        record each one that had not finished as interrupted."""
        self._stopping = True
        unfinished = [task for task in list(self.tasks.values()) if task.state not in FINISHED]
        for task in unfinished:
            task.cancel.set()
            if task.state == "queued":
                self._interrupt(task)
        self._executor.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(task.state not in FINISHED for task in unfinished):
            time.sleep(0.1)
        for task in unfinished:
            self._interrupt(task)
        stop_private_services()
