"""Background tasks of the server (pull, build, squash): state, progress, logs, events.

A task runs an engine call in a worker thread. Everything it reports goes
into its record (state, last progress, last log lines, result, error) and
into a numbered event list that clients stream and resume from (after a
browser reload, with Last-Event-ID). Tasks live as long as the server.
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from ..engine.errors import EngineError
from ..engine.progress import Progress

LOG_LINES = 200
MAX_EVENTS = 5000
FINISHED = ("succeeded", "failed", "cancelled")

# What a task runs: fn(progress_callback, cancel_event) -> JSON-able result.
Work = Callable[[Callable[[Progress], None], threading.Event], Any]


@dataclass
class Event:
    id: int
    kind: str          # "progress", "log", "state"
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
        return {"id": self.id, "kind": self.kind, "title": self.title, "state": self.state,
                "created": self.created, "finished": self.finished, "progress": self.progress,
                "log": list(self.log)[-log_lines:], "result": self.result, "error": self.error}


class TaskManager:
    """Starts tasks, records what they report and wakes up the clients streaming their events."""

    def __init__(self, workers: int = 4, log=None):
        self.tasks: dict[str, Task] = {}
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="podman-hpc-task")
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        self._log = log

    def start(self, kind: str, title: str, work: Work) -> Task:
        task = Task(id=uuid.uuid4().hex[:12], kind=kind, title=title)
        with self._lock:
            self.tasks[task.id] = task
        self._emit(task, "state", {"state": task.state})
        self._executor.submit(self._run, task, work)
        return task

    def get(self, task_id: str) -> Task | None:
        return self.tasks.get(task_id)

    def list(self) -> list[Task]:
        return sorted(self.tasks.values(), key=lambda t: t.created, reverse=True)

    def cancel(self, task: Task) -> None:
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
            self._finish(task, "cancelled" if task.cancel.is_set() else "failed", error=str(err))
        except Exception as err:  # noqa: BLE001 - a task must always end, with a message
            if self._log:
                self._log.error("podman-hpc task %s failed:\n%s", task.id, traceback.format_exc())
            self._finish(task, "failed", error=f"{type(err).__name__}: {err}")
        else:
            self._finish(task, "cancelled" if task.cancel.is_set() else "succeeded", result=result)

    def _set_state(self, task: Task, state: str) -> None:
        task.state = state
        self._emit(task, "state", {"state": state})

    def _finish(self, task: Task, state: str, *, result: Any = None, error: str | None = None) -> None:
        if task.state in FINISHED:
            return
        task.result, task.error, task.finished = result, error, time.time()
        if error:
            task.log.append(error)
        task.state = state
        self._emit(task, "state", {"state": state, "result": result, "error": error})

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

    def shutdown(self) -> None:
        for task in self.tasks.values():
            task.cancel.set()
        self._executor.shutdown(wait=False, cancel_futures=True)
