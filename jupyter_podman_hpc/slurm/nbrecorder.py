"""Rank 0's executed notebook: each cell's outputs recorded as they come, and written out.

Part of the notebook runner (``nbrunner.py``), copied beside it into the job
directory: Python's standard library only. The output notebook (nbformat 4,
``out/<stem>.out.ipynb``) is rewritten, temporary file and rename, when a cell
starts, when it ends, and at most every second while it prints;
``out/nbrun/progress.json`` says which cell rank 0 is in. The cell running
when the job is stopped keeps a note saying so. The other ranks' errors
(``out/nbrun/rank-<N>.json``) are merged in at each write.

Every file in ``out/`` may have been written by code in the image, and the
finish step reads and writes them on the host: so each is reached through a
descriptor of its directory, read as data (a regular file, never through a
link, at most a size, JSON) and replaced by a rename, never written through
a name the image could have made a link.
"""

# The image's python3 runs this file, whatever its version: it keeps to what old ones read (no f-strings,
# annotations or :=), so its strings are %-formatted.
# ruff: noqa: UP031

import base64
import datetime
import json
import os
import signal
import stat
import sys
import threading
import time

WRITE_EVERY = 1.0  # seconds between rewrites of the output notebook while a cell prints
# What the finish reads of the files ranks wrote, at most: a notebook with its images, an error report
NOTEBOOK_LIMIT = 64 << 20
RANK_FILE_LIMIT = 1 << 20
STATE_DIR = "nbrun"  # in the output directory: PROGRESS, and the other ranks' error reports (rank-N.json)
PROGRESS = "progress.json"
BINARY_MIME = ("image/png", "image/jpeg", "image/gif", "application/pdf")
RUNNING_NOTE = (
    "podman-hpc: rank 0 started this cell at {started} and had not finished it when this notebook was last written."
)
STOPPED_NOTE = (
    "podman-hpc: the job was stopped ({signal}) while rank 0 ran this cell, {elapsed:.1f} s after it started."
)


def is_plain_name(value):
    """Whether ``value`` is a file name of a job's directory, never a path: a non-empty string with no
    "/" or NUL, not hidden. What the host takes from a plan or record before joining it to a directory."""
    return (
        isinstance(value, str) and bool(value) and "/" not in value and "\0" not in value and not value.startswith(".")
    )


def now():
    """The current UTC time, ISO 8601 to the millisecond with a ``Z``, as the notebook's metadata holds it."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def write_json(path, data, dir_fd=None):
    """Readers see the old file or the new one, never a part of it: a new file under a random name
    (O_EXCL, never through a link, 0600) renamed over ``path`` (a name in ``dir_fd``, if given),
    which replaces a link planted there rather than follow it."""
    text = json.dumps(data, indent=1, ensure_ascii=False, default=repr) + "\n"
    head, name = os.path.split(path)
    tmp = os.path.join(head, ".%s.%s.tmp" % (name, os.urandom(8).hex()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def read_json(path, limit=None, dir_fd=None):
    """The JSON value in the file ``path`` (UTF-8; a name in ``dir_fd``, if given), opened without
    following a link or waiting on a FIFO; ValueError when it is not a regular file, is over
    ``limit`` bytes or is not JSON."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as source:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("%s is not a regular file" % path)
        data = source.read() if limit is None else source.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise ValueError("%s is over %d bytes" % (path, limit))
    return json.loads(data.decode("utf-8"))


def open_dir(path, dir_fd=None):
    """A descriptor of the directory ``path`` (a name in ``dir_fd``, if given), never of a link to one."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def mime_value(mime, value):
    """A value as nbformat stores it: base64 for binary types, text otherwise (JSON as is)."""
    if isinstance(value, (bytes, bytearray)):
        if mime in BINARY_MIME or not mime.startswith("text/"):
            return base64.b64encode(bytes(value)).decode("ascii")
        return bytes(value).decode("utf-8", "replace")
    if mime == "application/json" or mime.endswith("+json"):
        return value
    return value if isinstance(value, str) else str(value)


def bundle(data):
    """A display's MIME bundle as nbformat stores it (each value through ``mime_value``)."""
    return {mime: mime_value(mime, value) for mime, value in (data or {}).items()}


def locked(method):
    """Rank 0's notebook is changed by the cells (main thread) and written by the flusher too."""

    def run(self, *args, **kwargs):
        with self.lock:
            return method(self, *args, **kwargs)

    run.__name__, run.__doc__ = method.__name__, method.__doc__
    return run


class Recorder:
    """Rank 0's executed notebook: the cells' outputs as they come, written to disk as they change."""

    def __init__(self, plan, notebook, rank, size):
        self.plan = plan
        self.notebook = notebook
        self.size = size
        self.merged = set()  # rank files already merged
        self.extra = {}  # cell index -> the other ranks' errors there
        self.cell = None  # index of the running cell
        self.outputs = []
        self.started = 0.0
        self.last_write = 0.0
        self.clear_pending = False
        self.writing = False
        self.stop_signal = None  # a SIGTERM that came during a write, handled once it is done
        self.write_failed = False
        self.lock = threading.RLock()
        self.dirty = False  # outputs not written yet (the flusher writes them within a second)
        self.disabled = False  # in a process the cells forked: not the recorder
        os.register_at_fork(after_in_child=self.forget)
        for cell in notebook["cells"]:
            if cell.get("cell_type") == "code":
                cell["outputs"], cell["execution_count"] = [], None
            cell.get("metadata", {}).pop("podman_hpc", None)
        self.meta = notebook.setdefault("metadata", {})["podman_hpc"] = {
            "state": "running",
            "started": now(),
            "updated": None,
            "cell": None,
            "ntasks": size,
            "job_id": os.environ.get("SLURM_JOB_ID", ""),
            "errors": [],
        }
        self.code_cells = [i for i, c in enumerate(notebook["cells"]) if c.get("cell_type") == "code"]

    def forget(self):
        """In a child forked from rank 0 (a cell's ``os.fork``): record nothing and leave SIGTERM to the
        default, so that only the parent writes the notebook."""
        self.disabled, self.lock = True, threading.RLock()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def flush_forever(self):
        """A daemon thread: output a cell printed while it goes on running reaches the disk within a second."""
        while True:
            time.sleep(WRITE_EVERY / 2)
            if self.dirty and not self.disabled and time.monotonic() - self.last_write >= WRITE_EVERY:
                self.write()

    # outputs of the running cell
    @locked
    def add(self, output):
        """Append an output to the running cell (a stream joined to the stream before it of the same name),
        and write the notebook if the last write is a second old; nothing between cells."""
        if self.cell is None or self.disabled:
            return
        if self.clear_pending:
            self.outputs, self.clear_pending = [], False
        if output["output_type"] == "stream" and self.outputs:
            last = self.outputs[-1]
            if last["output_type"] == "stream" and last["name"] == output["name"]:
                last["text"] += output["text"]
                output = None
        if output is not None:
            self.outputs.append(output)
        self.dirty = True
        if time.monotonic() - self.last_write >= WRITE_EVERY:
            self.write()

    def stream(self, name, text):
        """Record text printed to ``stdout`` or ``stderr`` (``name``) by the running cell."""
        if text:
            self.add({"output_type": "stream", "name": name, "text": text})

    def display(self, data, metadata=None, kind="display_data"):
        """Record a display (or, with ``kind="execute_result"``, the cell's result, numbered as the cell)."""
        output = {"output_type": kind, "data": bundle(data), "metadata": metadata or {}}
        if kind == "execute_result":
            running = self.notebook["cells"][self.cell] if self.cell is not None else {}
            output["execution_count"] = running.get("execution_count")
        self.add(output)

    def error(self, ename, evalue, lines):
        """Record the running cell's error: exception name, message, traceback lines."""
        self.add({"output_type": "error", "ename": ename, "evalue": evalue, "traceback": list(lines)})

    @locked
    def clear(self, wait=False):
        """Clear the running cell's outputs (IPython's ``clear_output``); with ``wait``, at the next output."""
        if wait:
            self.clear_pending = True
        else:
            self.outputs, self.clear_pending = [], False

    def has_error(self):
        """The running cell has recorded an error."""
        return any(o["output_type"] == "error" for o in self.outputs)

    # cells
    @locked
    def start(self, index, count):
        """Cell ``index`` starts as execution ``count``: mark it running (keeping errors other ranks already
        reported there) and write the notebook."""
        self.cell, self.outputs, self.started = index, [], time.monotonic()
        cell = self.notebook["cells"][index]
        cell["execution_count"] = count
        rank_errors = cell.get("metadata", {}).get("podman_hpc", {}).get("rank_errors")
        cell.setdefault("metadata", {})["podman_hpc"] = {"status": "running", "started": now()}
        if rank_errors:  # another rank got here first, and raised
            cell["metadata"]["podman_hpc"]["rank_errors"] = rank_errors
        self.meta["cell"] = index
        self.write()

    @locked
    def end(self, status):
        """The running cell ended with ``status`` (``ok``, ``error``): its outputs, the other ranks' merged
        in, its end time and duration; the notebook is written."""
        cell = self.notebook["cells"][self.cell]
        cell["outputs"] = self.outputs + self.extra.get(self.cell, [])
        info = cell["metadata"]["podman_hpc"]
        info.update(status=status, finished=now(), duration=round(time.monotonic() - self.started, 3))
        self.cell, self.outputs = None, []
        self.write()

    @locked
    def stopped(self, signame):
        """The job is being stopped: say so at the running cell, and write a last time."""
        if self.cell is not None:
            cell = self.notebook["cells"][self.cell]
            cell["outputs"] = [
                *self.outputs,
                note(STOPPED_NOTE.format(signal=signame, elapsed=time.monotonic() - self.started)),
                *self.extra.get(self.cell, []),
            ]
            cell["metadata"]["podman_hpc"].update(status="stopped", finished=now())
        self.meta["state"] = "stopped"
        self.cell = None
        self.write()

    @locked
    def write(self, state=None):
        """Write the output notebook and the progress file (with ``state``, the run's state), the other
        ranks' errors merged in first; nothing if a write is under way (a signal mid-write) or the
        recorder is disabled."""
        if self.writing or self.disabled:
            return
        self.writing, self.dirty = True, False
        try:
            if state:
                self.meta["state"] = state
            for index, output in merge_rank_files(self.plan, self.notebook, self.merged):
                self.extra.setdefault(index, []).append(output)
                if index != self.cell:
                    self.notebook["cells"][index].setdefault("outputs", []).append(output)
            if self.cell is not None:
                cell = self.notebook["cells"][self.cell]
                started = cell["metadata"]["podman_hpc"]["started"]
                cell["outputs"] = [
                    *self.outputs,
                    note(RUNNING_NOTE.format(started=started)),
                    *self.extra.get(self.cell, []),
                ]
            self.meta["cell"] = self.cell
            self.meta["updated"] = now()
            try:
                write_json(self.plan.output_name, self.notebook, dir_fd=self.plan.out_fd)
                write_json(PROGRESS, progress_of(self.notebook, self.plan), dir_fd=self.plan.state_fd)
            except OSError as err:  # a full or gone file system must not stop the computation
                if not self.write_failed:
                    sys.__stderr__.write("nbrunner: cannot write the output notebook: %s\n" % err)
                self.write_failed = True
            self.last_write = time.monotonic()
        finally:
            self.writing = False
        if self.stop_signal:
            self.stop_now(self.stop_signal)

    def on_signal(self, signum, frame):
        """SIGTERM (scancel, the time limit): note the stop and exit now, or once the write under way is
        done."""
        name = signal.Signals(signum).name
        if self.writing:
            self.stop_signal = name  # the write under way finishes first
        else:
            self.stop_now(name)

    def stop_now(self, signame):
        """Note the stop (``signame``) at the running cell, write the notebook a last time, and exit at once
        with 128 + the signal's number."""
        self.stop_signal = None
        self.stopped(signame)
        sys.__stdout__.flush()
        os._exit(128 + getattr(signal, signame))


def note(text):
    """A display output holding the runner's own note (``text``), marked as such in its metadata."""
    return {"output_type": "display_data", "data": {"text/plain": text}, "metadata": {"podman_hpc": "note"}}


def progress_of(notebook, plan):
    """What the job panel and the magic show while the job runs: rank 0's cell, the errors so far."""
    meta = notebook["metadata"]["podman_hpc"]
    code = [i for i, c in enumerate(notebook["cells"]) if c.get("cell_type") == "code"]
    current = meta.get("cell") if meta.get("cell") in code else None
    return {
        "state": meta.get("state"),
        "cell": None if current is None else current + 1,
        "code_cell": None if current is None else code.index(current) + 1,
        "code_cells": len(code),
        "cells": len(notebook["cells"]),
        "updated": meta.get("updated"),
        "errors": meta.get("errors", []),
        "output": plan.output_name,
    }


def merge_rank_files(plan, notebook, merged):
    """Each other rank's error (``rank-N.json``) not merged yet, noted in its cell's metadata:
    [(cell index, error output)] for the caller to show there. A report that is not one (being
    written, or not ours) is left out."""
    found = []
    try:
        names = sorted(os.listdir(plan.state_fd))
    except OSError:
        return found
    meta = notebook["metadata"]["podman_hpc"]
    for name in names:
        if name.startswith("rank-") and name.endswith(".json") and name not in merged:
            _merge_rank_file(plan, notebook, meta, merged, name, found)
    return found


def _merge_rank_file(plan, notebook, meta, merged, name, found):
    """One rank's report ``name``: into its cell's and the notebook's errors, and into ``found`` for the
    caller, unless its cell already holds that rank's error."""
    try:
        index, report = rank_report(read_json(name, RANK_FILE_LIMIT, dir_fd=plan.state_fd), notebook)
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return
    merged.add(name)
    info = notebook["cells"][index].setdefault("metadata", {}).setdefault("podman_hpc", {})
    errors = info.setdefault("rank_errors", [])
    if any(e.get("rank") == report["rank"] for e in errors):
        return
    summary = {k: report[k] for k in ("rank", "node", "ename", "evalue")}
    errors.append(summary)
    found.append((index, _error_output(report)))
    meta.setdefault("errors", []).append(dict(summary, cell=index + 1))


def _error_output(report):
    """The error output a rank's report shows in its cell."""
    header = "rank %s (on %s) raised this in this cell and stopped:" % (report["rank"], report["node"] or "?")
    return {
        "output_type": "error",
        "ename": report["ename"],
        "evalue": report["evalue"],
        "traceback": [header] + report["traceback"],
    }


def rank_report(data, notebook):
    """A rank's error report as read (JSON a rank wrote), checked: (its cell's index, the report with
    every field of the expected type); ValueError, KeyError, IndexError or TypeError when it is not one."""
    index = int(data["cell"])
    if index < 0 or not isinstance(notebook["cells"][index], dict):
        raise IndexError(index)
    traceback = data.get("traceback", [])
    if not isinstance(traceback, list):
        raise TypeError("traceback")
    return index, {
        "rank": data.get("rank"),
        "node": data.get("node"),
        "ename": str(data.get("ename", "Error")),
        "evalue": str(data.get("evalue", "")),
        "traceback": [str(line) for line in traceback],
    }
