"""The Job a notebook gets back from ``%podman_hpc submit``: a thin wrapper around ``slurm.Job``.

Its rich display is a live status widget (state, elapsed time, nodes, exit
code) that a background thread keeps up to date without blocking the
kernel: the cell that displays it returns at once, and the widget changes
while other cells run. The thread polls Slurm (squeue, then sacct: the job
API's ``status()``) with a back-off from 0.5 s to POLL_MAX, redraws the
elapsed time every second in between, and ends when the job has finished
(or the widget is closed). Widgets are set from that thread: ipykernel
sends comm messages over its thread-safe IOPub socket.

Headless (see ``render.widgets_enabled``) the display is one line of text,
the status when displayed; nothing updates in the background, so a saved
notebook holds a stable output.
"""

from __future__ import annotations

import html
import threading
import time

from ..slurm import Job as SlurmJob
from ..slurm import JobStatus
from ..slurm.client import SlurmError
from ..slurm.spec import JobSpecError
from .render import widgets_enabled

POLL_MIN = 0.5
POLL_MAX = 3.0
TICK = 1.0
_COLORS = {
    "PENDING": "#b58900",
    "RUNNING": "#268bd2",
    "COMPLETED": "#2e7d32",
    "FAILED": "#c62828",
    "CANCELLED": "#6d4c41",
    "TIMEOUT": "#c62828",
    "UNKNOWN": "#757575",
}


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{hours:d}:{minutes:02d}:{secs:02d}" if hours or days else f"{minutes:d}:{secs:02d}"
    return f"{days}-{text}" if days else text


class Job:
    """A submitted job: ``id``, ``status()``, ``wait()``, ``logs()``, ``cancel()``; ``job`` is
    the job API's ``slurm.Job``."""

    def __init__(self, job: SlurmJob, status: JobStatus | None = None):
        self.job = job
        self._lock = threading.Lock()
        self._status: JobStatus | None = status
        self._seen_at = time.monotonic()
        self._view: _StatusView | None = None

    # --- the job API, delegated ---------------------------------------------------

    @property
    def id(self) -> str:
        """The Slurm job id."""
        return self.job.id

    @property
    def directory(self):
        """The job directory: its record, batch script and logs."""
        return self.job.directory

    @property
    def script(self) -> str:
        """The batch script exactly as submitted."""
        return self.job.script

    @property
    def spec(self):
        """The job's specification, as submitted."""
        return self.job.spec

    @property
    def name(self) -> str:
        """The Slurm job name (the spec's, else the one the batch script gets)."""
        try:
            return self.job.spec.default_job_name()
        except JobSpecError:  # a record this version refuses (an older one's)
            return self.job.record.spec.get("job_name") or ""

    def status(self, refresh: bool = True) -> JobStatus:
        """Slurm's view of the job now (``refresh=False``: the last one seen)."""
        if not refresh and self._status is not None:
            return self._status
        with self._lock:
            status = self.job.status()
            self._status, self._seen_at = status, time.monotonic()
        return status

    @property
    def state(self) -> str:
        """The job's Slurm state as last seen (asked of Slurm only if it never was)."""
        return self.status(refresh=False).state

    def wait(self, timeout: float | None = None, poll_interval: float = 1.0) -> JobStatus:
        """Until the job has finished; its final status (``JobTimeout`` after ``timeout`` s)."""

        def seen(_event) -> None:
            status = self.job.status(refresh=False)  # the one wait() just read, no new query
            if isinstance(status, JobStatus):
                self._status, self._seen_at = status, time.monotonic()
                if self._view is not None:
                    self._view.show(status, self._seen_at)

        status = self.job.wait(timeout=timeout, poll_interval=poll_interval, progress=seen)
        self._status, self._seen_at = status, time.monotonic()
        if self._view is not None:
            self._view.show(status, self._seen_at)
        return status

    def logs(self, stream: str = "out") -> dict[int, str]:
        """Each rank's output (``stream`` "out" or "err"), by rank."""
        return self.job.logs(stream)

    def output(self, stream: str = "out") -> str:
        """Every rank's lines, prefixed with the rank (as ``srun --label``)."""
        return self.job.labelled_output(stream)

    def batch_log(self) -> str:
        """Slurm's log of the batch script (``slurm-<jobid>.out``), where srun's own errors land."""
        return self.job.batch_log()

    @property
    def output_notebook(self):
        """The executed notebook of a notebook job (a Path; rank 0 writes it as cells run), else None."""
        from pathlib import Path

        info = self.job.output_notebook()
        return Path(info["path"]) if info else None

    def cancel(self) -> None:
        """Cancel the job (scancel), and have its status widget, if shown, ask Slurm again at once."""
        self.job.cancel()
        if self._view is not None:
            self._view.poll_soon()

    # --- display ------------------------------------------------------------------

    def summary(self) -> str:
        """One line for the notebook: the job's status (``job 84 RUNNING on n[1-2] ...``), its shape and
        directory; the error's text when Slurm cannot be asked."""
        status = self._status
        if status is None:
            try:
                status = self.status()
            except SlurmError as err:
                return f"job {self.id}: {err}"
        spec = self.job.record.spec
        shape = f"{spec.get('nodes')} node(s) x {spec.get('tasks_per_node')} task(s)"
        return f"{status.describe()} [{shape}, {self.directory}]"

    def __repr__(self) -> str:
        state = f" {self._status.state}" if self._status else ""
        return f"<Job {self.id}{state}>"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        if widgets_enabled():
            bundle = self.widget()._repr_mimebundle_(include=include, exclude=exclude) or {}
            bundle = dict(bundle)
            bundle["text/plain"] = self.summary()
            return bundle
        return {"text/plain": self.summary()}

    def widget(self):
        """The live status widget (one per Job; its updater starts on first use)."""
        if self._view is None:
            self._view = _StatusView(self)
            self._view.start()
        return self._view.widget


class _StatusView:
    """An HTML widget with the job's state, elapsed time, nodes and exit code, and its updater."""

    def __init__(self, job: Job):
        import ipywidgets as w

        self.job = job
        self.widget = w.HTML(self._html(job._status, job._seen_at))
        self.stop = threading.Event()
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.updates = 0
        self._drawn = ""
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start polling Slurm in the background to keep the widget current; nothing for a job already
        finished."""
        status = self.job._status
        if status is not None and status.finished:
            return
        self.thread = threading.Thread(target=self._run, name=f"podman-hpc-job-{self.job.id}", daemon=True)
        self.thread.start()

    def poll_soon(self) -> None:
        """Have the poller ask Slurm now rather than at its next turn (after a cancel)."""
        self.wake.set()

    def _run(self) -> None:
        delay, next_poll = POLL_MIN, 0.0
        failures = 0
        while not self.stop.is_set():
            if getattr(self.widget, "comm", True) is None:  # the widget was closed
                return
            now = time.monotonic()
            if now >= next_poll or self.wake.is_set():
                self.wake.clear()
                try:
                    status = self.job.status()
                    failures = 0
                except Exception:  # noqa: BLE001  a failed poll (a busy slurmctld) never ends the view: last status kept
                    failures += 1
                    status = self.job._status
                    if failures >= 20:
                        return
                next_poll = time.monotonic() + delay
                delay = min(delay * 2, POLL_MAX)
                if status is not None and status.finished:
                    self.show(status, self.job._seen_at)
                    return
            self.show(self.job._status, self.job._seen_at)
            self.wake.wait(min(TICK, max(0.05, next_poll - time.monotonic())))

    def show(self, status: JobStatus | None, seen_at: float) -> None:
        """Draw ``status`` (as seen at ``seen_at``, a monotonic time) in the widget, when it changes what
        the widget shows."""
        text = self._html(status, seen_at)
        with self._lock:
            if text != self._drawn:
                self._drawn = text
                self.widget.value = text
                self.updates += 1

    def _html(self, status: JobStatus | None, seen_at: float) -> str:
        job = self.job
        spec = job.job.record.spec
        if status is None:
            state, color, elapsed, nodes, code = "submitted", "#757575", None, "", None
        else:
            state, color = status.state, _COLORS.get(status.state, "#757575")
            elapsed = status.elapsed
            if status.state == "RUNNING" and elapsed is not None:
                elapsed += time.monotonic() - seen_at  # ticks between two polls
            nodes = status.nodelist
            code = status.exit_code
            if status.reason and status.state == "PENDING":
                state = f"{state} ({status.reason})"
        cells = [
            ("Job", f"{html.escape(job.id)} <span style='color:#757575'>{html.escape(job.name)}</span>"),
            ("State", f"<b style='color:{color}'>{html.escape(state)}</b>"),
            ("Elapsed", _clock(elapsed)),
            ("Nodes", html.escape(nodes or "-") + f" ({spec.get('nodes')} x {spec.get('tasks_per_node')} tasks)"),
            ("Exit code", "-" if code is None else str(code)),
            ("Directory", f"<code>{html.escape(str(job.directory))}</code>"),
        ]
        row = "".join(
            f"<tr><th style='text-align:left;padding-right:1em'>{k}</th><td style='text-align:left'>{v}</td></tr>"
            for k, v in cells
        )
        return f"<table class='podman-hpc-job'>{row}</table>"


def _output(info) -> str:
    """The output notebook column: its name, and where rank 0 is or which cell failed on which rank."""
    if not info:
        return "-"
    from ..slurm.notebook import describe_progress

    state = describe_progress(info, short=True)
    return f"{info['name']} ({state})" if state else info["name"]


class JobList(list):
    """``%podman_hpc jobs``: a list of Job, shown as a table; ``problems`` are the job records
    that could not be read (one line each, shown above the table)."""

    HEADER = ("JOB ID", "NAME", "STATE", "NODES", "ELAPSED", "SUBMITTED", "IMAGE", "OUTPUT")

    def __init__(self, jobs=(), problems=()):
        super().__init__(jobs)
        self.problems = list(problems)

    @classmethod
    def load(cls) -> JobList:
        """The user's jobs, newest first, with their last known status (one Slurm query)."""
        from ..engine.errors import EngineError
        from ..slurm import SlurmClient

        problems: list[str] = []
        jobs = []
        for job in reversed(SlurmJob.list(client=SlurmClient(), problems=problems)):
            try:
                status = job.status(refresh=False)
            except EngineError:
                status = None
            jobs.append(Job(job, status))
        return cls(jobs, problems)

    def rows(self) -> list[tuple[str, ...]]:
        """The jobs table: id, name, state, nodes, elapsed time, submit time, image and output notebook of
        each job, as last seen."""
        rows = [self.HEADER]
        for job in self:
            status = job._status
            spec = job.job.record.spec
            rows.append(
                (
                    job.id,
                    job.name,
                    status.state if status else "?",
                    status.nodelist if status and status.nodelist else "-",
                    _clock(status.elapsed) if status else "-",
                    job.job.submitted[:19].replace("T", " "),
                    spec.get("image", ""),
                    _output(job.job.output_notebook()),
                )
            )
        return rows

    def _repr_pretty_(self, p, cycle) -> None:
        from ..engine.text import text_table

        notes = "".join(f"warning: {problem}\n" for problem in self.problems)
        p.text(notes + (text_table(self.rows()) if self else "no jobs"))

    def _repr_html_(self) -> str:
        from .display import html_table

        notes = "".join(
            f"<p class='podman-hpc-warning'>warning: {html.escape(problem)}</p>" for problem in self.problems
        )
        return notes + (html_table(self.rows()) if self else "<p>no jobs</p>")


__all__ = ["Job", "JobList"]
