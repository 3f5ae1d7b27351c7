"""Run a notebook cell by cell on every rank of a job; rank 0 writes the executed notebook.

This file is copied into the job directory and run by the image's
``python3``: it uses Python's standard library only, and IPython when the
notebook needs it (magics: ``ipython`` is ``require``) or may use it for rich
output (``prefer``) and the image has it. Nothing of jupyter-podman-hpc, no
kernel and no nbclient is needed in the image.

    python3 -u nbrunner.py PLAN [ARGS...]          every rank (sys.argv = [NOTEBOOK, *ARGS])
    python3 nbrunner.py --finish PLAN EXIT_CODE    once, after the step, on the batch host

``PLAN`` (``nbrun/plan.json`` in the job directory, written at submit) names
the notebook, the output notebook and what to run. Every rank runs every
code cell in order; a cell that raises stops its rank (exit code 1). Rank 0
records each cell's outputs (streams, results, displays of every MIME type,
errors) and rewrites ``<stem>.out.ipynb`` (nbformat 4, temporary file and
rename) when a cell starts, when it ends, and at most every second while it
prints; ``nbrun/progress.json`` says which cell it is in. The cell running
when the job is stopped keeps a note saying so. Another rank that raises
writes ``nbrun/rank-<N>.json``; rank 0 merges those into the output notebook
at each write, and ``--finish`` merges whatever is left once every rank has
ended (a scancel'd job keeps what rank 0 merged).
"""

import ast
import base64
import datetime
import json
import linecache
import os
import signal
import sys
import threading
import time
import traceback
import types

PLAN_VERSION = 1
WRITE_EVERY = 1.0  # seconds between rewrites of the output notebook while a cell prints
BINARY_MIME = ("image/png", "image/jpeg", "image/gif", "application/pdf")
REPR_METHODS = (("_repr_html_", "text/html"), ("_repr_markdown_", "text/markdown"),
                ("_repr_svg_", "image/svg+xml"), ("_repr_png_", "image/png"), ("_repr_jpeg_", "image/jpeg"),
                ("_repr_latex_", "text/latex"), ("_repr_json_", "application/json"),
                ("_repr_javascript_", "application/javascript"))
RUNNING_NOTE = "podman-hpc: rank 0 started this cell at {started} and had not finished it when this notebook was last written."
STOPPED_NOTE = "podman-hpc: the job was stopped ({signal}) while rank 0 ran this cell, {elapsed:.1f} s after it started."


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def write_json(path, data):
    """Readers see the old file or the new one, never a part of it."""
    tmp = "%s.%s.%d.tmp" % (path, os.uname().nodename, os.getpid())
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=1, ensure_ascii=False, default=repr)
        out.write("\n")
    os.replace(tmp, path)


def read_json(path):
    with open(path, encoding="utf-8") as source:
        return json.load(source)


class Plan:
    """plan.json, with its paths made absolute (they are relative to the job directory)."""

    def __init__(self, path):
        data = read_json(path)
        if data.get("version") != PLAN_VERSION:
            raise SystemExit("nbrunner: %s is not a plan of this runner" % path)
        self.path = os.path.abspath(path)
        self.state_dir = os.path.dirname(self.path)
        self.job_dir = os.path.dirname(self.state_dir)
        self.notebook = os.path.join(self.job_dir, data["notebook"])
        self.output = os.path.join(self.job_dir, data["output"])
        self.progress = os.path.join(self.state_dir, "progress.json")
        self.ipython = data.get("ipython", "never")
        self.code = {int(k): v for k, v in data.get("code", {}).items()}

    def rank_file(self, rank):
        return os.path.join(self.state_dir, "rank-%d.json" % rank)


def cell_source(cell):
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


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
    return {mime: mime_value(mime, value) for mime, value in (data or {}).items()}


# --- the output notebook ------------------------------------------------------------------------

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
        self.merged = set()          # rank files already merged
        self.extra = {}              # cell index -> the other ranks' errors there
        self.cell = None             # index of the running cell
        self.outputs = []
        self.started = 0.0
        self.last_write = 0.0
        self.clear_pending = False
        self.writing = False
        self.stop_signal = None      # a SIGTERM that came during a write, handled once it is done
        self.write_failed = False
        self.lock = threading.RLock()
        self.dirty = False           # outputs not written yet (the flusher writes them within a second)
        self.disabled = False        # in a process the cells forked: not the recorder
        os.register_at_fork(after_in_child=self.forget)
        for cell in notebook["cells"]:
            if cell.get("cell_type") == "code":
                cell["outputs"], cell["execution_count"] = [], None
            cell.get("metadata", {}).pop("podman_hpc", None)
        self.meta = notebook.setdefault("metadata", {})["podman_hpc"] = {
            "state": "running", "started": now(), "updated": None, "cell": None, "ntasks": size,
            "job_id": os.environ.get("SLURM_JOB_ID", ""), "errors": []}
        self.code_cells = [i for i, c in enumerate(notebook["cells"]) if c.get("cell_type") == "code"]

    def forget(self):
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
        if text:
            self.add({"output_type": "stream", "name": name, "text": text})

    def display(self, data, metadata=None, kind="display_data"):
        output = {"output_type": kind, "data": bundle(data), "metadata": metadata or {}}
        if kind == "execute_result":
            running = self.notebook["cells"][self.cell] if self.cell is not None else {}
            output["execution_count"] = running.get("execution_count")
        self.add(output)

    def error(self, ename, evalue, lines):
        self.add({"output_type": "error", "ename": ename, "evalue": evalue, "traceback": list(lines)})

    @locked
    def clear(self, wait=False):
        if wait:
            self.clear_pending = True
        else:
            self.outputs, self.clear_pending = [], False

    def has_error(self):
        return any(o["output_type"] == "error" for o in self.outputs)

    # cells
    @locked
    def start(self, index, count):
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
            cell["outputs"] = self.outputs + [note(STOPPED_NOTE.format(
                signal=signame, elapsed=time.monotonic() - self.started))] + self.extra.get(self.cell, [])
            cell["metadata"]["podman_hpc"].update(status="stopped", finished=now())
        self.meta["state"] = "stopped"
        self.cell = None
        self.write()

    @locked
    def write(self, state=None):
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
                cell["outputs"] = (self.outputs + [note(RUNNING_NOTE.format(started=started))]
                                   + self.extra.get(self.cell, []))
            self.meta["cell"] = self.cell
            self.meta["updated"] = now()
            try:
                write_json(self.plan.output, self.notebook)
                write_json(self.plan.progress, progress_of(self.notebook, self.plan))
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
        name = signal.Signals(signum).name
        if self.writing:
            self.stop_signal = name  # the write under way finishes first
        else:
            self.stop_now(name)

    def stop_now(self, signame):
        self.stop_signal = None
        self.stopped(signame)
        sys.__stdout__.flush()
        os._exit(128 + getattr(signal, signame))


def note(text):
    return {"output_type": "display_data", "data": {"text/plain": text}, "metadata": {"podman_hpc": "note"}}


def progress_of(notebook, plan):
    """What the job panel and the magic show while the job runs: rank 0's cell, the errors so far."""
    meta = notebook["metadata"]["podman_hpc"]
    code = [i for i, c in enumerate(notebook["cells"]) if c.get("cell_type") == "code"]
    current = meta.get("cell")
    return {"state": meta.get("state"), "cell": None if current is None else current + 1,
            "code_cell": None if current is None else code.index(current) + 1, "code_cells": len(code),
            "cells": len(notebook["cells"]), "updated": meta.get("updated"), "errors": meta.get("errors", []),
            "output": os.path.basename(plan.output)}


def merge_rank_files(plan, notebook, merged):
    """Each other rank's error (``rank-N.json``) not merged yet, noted in its cell's metadata:
    [(cell index, error output)] for the caller to show there."""
    found = []
    try:
        names = sorted(os.listdir(plan.state_dir))
    except OSError:
        return found
    meta = notebook["metadata"]["podman_hpc"]
    for name in names:
        if not (name.startswith("rank-") and name.endswith(".json")) or name in merged:
            continue
        try:
            report = read_json(os.path.join(plan.state_dir, name))
            index = int(report["cell"])
            cell = notebook["cells"][index]
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            continue  # being written, or not ours
        merged.add(name)
        info = cell.setdefault("metadata", {}).setdefault("podman_hpc", {})
        errors = info.setdefault("rank_errors", [])
        if any(e.get("rank") == report.get("rank") for e in errors):
            continue
        summary = {k: report.get(k) for k in ("rank", "node", "ename", "evalue")}
        errors.append(summary)
        header = "rank %s (on %s) raised this in this cell and stopped:" % (report.get("rank"), report.get("node") or "?")
        found.append((index, {"output_type": "error", "ename": report.get("ename", "Error"),
                              "evalue": report.get("evalue", ""),
                              "traceback": [header] + list(report.get("traceback", []))}))
        meta.setdefault("errors", []).append(dict(summary, cell=index + 1))
    return found


# --- running cells ------------------------------------------------------------------------------

class Tee:
    """sys.stdout/sys.stderr: everything goes to the rank's log as before, and to the recorder."""

    def __init__(self, stream, name, recorder):
        self.stream, self.name, self.recorder = stream, name, recorder

    def write(self, text):
        written = self.stream.write(text)
        if self.recorder is not None:
            self.recorder.stream(self.name, text)
        return written

    def flush(self):
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


class PlainRunner:
    """Cells as Python code, as ``python3 script.py`` would run them, with a notebook's last-expression result."""

    def __init__(self, recorder):
        self.recorder = recorder
        module = types.ModuleType("__main__")
        module.__dict__["__builtins__"] = __builtins__
        sys.modules["__main__"] = module  # pickling what the cells define works as in a script
        self.namespace = module.__dict__

    def run(self, code, index):
        filename = "<cell %d>" % (index + 1)
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        try:
            tree = ast.parse(code, filename, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr) and not code.rstrip().endswith(";"):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, filename, "exec"), self.namespace)
            if last is not None:
                value = eval(compile(last, filename, "eval"), self.namespace)
                if value is not None:
                    self.namespace["_"] = value
                    if self.recorder is not None:
                        self.recorder.display(rich_repr(value), kind="execute_result")
        except BaseException as err:  # noqa: BLE001 - a cell's error is the notebook's, reported like Python does
            if isinstance(err, SystemExit) and not err.code:
                raise
            lines = traceback.format_exception(type(err), err, _user_frames(err.__traceback__))
            sys.__stderr__.write("".join(lines))
            sys.__stderr__.flush()
            return type(err).__name__, str(err), [line.rstrip("\n") for line in lines]
        return None


def _user_frames(tb):
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb


def rich_repr(value):
    """What IPython's formatters would give for ``value``, from its ``_repr_*_`` methods."""
    data = {"text/plain": repr(value)}
    if isinstance(value, type):
        return data
    method = getattr(value, "_repr_mimebundle_", None)
    if callable(method):
        try:
            found = method(include=None, exclude=None)
            found = found[0] if isinstance(found, tuple) else found
            data.update(found or {})
        except Exception:  # noqa: BLE001 - a broken repr leaves text/plain
            pass
    for name, mime in REPR_METHODS:
        method = getattr(value, name, None)
        if mime in data or not callable(method):
            continue
        try:
            found = method()
        except Exception:  # noqa: BLE001
            continue
        found = found[0] if isinstance(found, tuple) else found
        if found is not None:
            data[mime] = found
    return data


def ipython_runner(recorder):
    """A batch IPython shell whose results, displays and errors go to the recorder (rank 0)."""
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets import Type
    from traitlets.config import Config

    class Hook(DisplayHook):
        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            if recorder is not None:
                recorder.display(format_dict, md_dict, kind="execute_result")

        def finish_displayhook(self):
            sys.stdout.flush()

    class Publisher(DisplayPublisher):
        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
            if recorder is not None:
                recorder.display(data, metadata)
            if "text/plain" in data:  # the rank's log shows it, as a script's display() did
                sys.__stdout__.write(str(data["text/plain"]) + "\n")

        def clear_output(self, wait=False):
            if recorder is not None:
                recorder.clear(wait)

    class BatchShell(InteractiveShell):
        displayhook_class = Type(Hook)
        display_pub_class = Type(Publisher)

        def _showtraceback(self, etype, evalue, stb):
            self.last_error = (etype.__name__, str(evalue), list(stb))
            sys.__stderr__.write(self.InteractiveTB.stb2text(stb) + "\n")
            sys.__stderr__.flush()

        def show_usage_error(self, exc):
            self.last_error = ("UsageError", str(exc), ["UsageError: %s" % exc])
            sys.__stderr__.write("UsageError: %s\n" % exc)

    if "MPLBACKEND" not in os.environ:
        import importlib.util
        if importlib.util.find_spec("matplotlib_inline") is not None:
            # figures are displayed at the end of each cell, as in a notebook
            os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    config = Config()
    config.HistoryManager.enabled = False
    config.InteractiveShell.colors = "NoColor"
    shell = BatchShell.instance(config=config)
    try:
        shell.InteractiveTB.set_colors("NoColor")
    except Exception:  # noqa: BLE001 - newer IPython names its themes differently
        pass

    class Runner:
        namespace = shell.user_ns

        def run(self, code, index):
            shell.last_error = None
            result = shell.run_cell(code, store_history=True)
            if result.success:
                return None
            if shell.last_error:
                return shell.last_error
            err = result.error_in_exec or result.error_before_exec
            return type(err).__name__, str(err), ["%s: %s" % (type(err).__name__, err)]

    return Runner()


def make_runner(plan, recorder):
    if plan.ipython in ("require", "prefer"):
        try:
            return ipython_runner(recorder)
        except ImportError as err:
            if plan.ipython == "require":
                return SystemExit("nbrunner: this notebook uses IPython magics and the image has no IPython "
                                  "(%s): install ipython in the image, or submit with notebook_magics='comment'" % err)
    return PlainRunner(recorder)


# --- the two entry points -----------------------------------------------------------------------

def run(plan_path, args):
    plan = Plan(plan_path)
    rank = int(os.environ.get("SLURM_PROCID", os.environ.get("PMI_RANK", "0")) or 0)
    size = int(os.environ.get("SLURM_NTASKS", "1") or 1)
    notebook = read_json(plan.notebook)
    sys.argv = [plan.notebook] + list(args)
    recorder = Recorder(plan, notebook, rank, size) if rank == 0 else None
    if recorder is not None:
        signal.signal(signal.SIGTERM, recorder.on_signal)  # scancel, or the time limit
        recorder.write()
        threading.Thread(target=recorder.flush_forever, name="nbrunner-flush", daemon=True).start()
    sys.stdout = Tee(sys.stdout, "stdout", recorder)
    sys.stderr = Tee(sys.stderr, "stderr", recorder)
    runner = make_runner(plan, recorder)
    if isinstance(runner, SystemExit):
        failure = ("ImportError", str(runner), [str(runner)])
        first = next((i for i, c in enumerate(notebook["cells"]) if c.get("cell_type") == "code"), None)
        return end(plan, recorder, rank, first, failure, notebook)
    count = 0
    for index, cell in enumerate(notebook["cells"]):
        if cell.get("cell_type") != "code":
            continue
        code = plan.code.get(index, cell_source(cell))
        if not code.strip():
            continue
        count += 1
        if recorder is not None:
            recorder.start(index, count)
        try:
            failure = runner.run(code, index)
        except SystemExit:  # sys.exit(0) in a cell: the notebook ends there, as a script would
            if recorder is not None:
                recorder.end("ok")
                recorder.write(state="failed" if recorder.meta["errors"] else "completed")
            raise
        sys.stdout.flush()
        sys.stderr.flush()
        if failure is not None:
            return end(plan, recorder, rank, index, failure, notebook)
        if recorder is not None:
            recorder.end("ok")
    if recorder is not None:
        recorder.write(state="failed" if recorder.meta["errors"] else "completed")
    return 0


def end(plan, recorder, rank, index, failure, notebook):
    """A cell raised on this rank: record it (rank 0) or report it (the others); exit code 1."""
    ename, evalue, lines = failure
    node = os.environ.get("SLURMD_NODENAME", os.uname().nodename)
    if recorder is not None:
        if index is not None:
            if recorder.cell is None:
                recorder.start(index, None)
            if not recorder.has_error():
                recorder.error(ename, evalue, lines)
            recorder.end("error")
            recorder.meta["errors"].append({"rank": 0, "node": node, "ename": ename, "evalue": evalue,
                                            "cell": index + 1})
        recorder.write(state="failed")
    else:
        write_json(plan.rank_file(rank), {
            "rank": rank, "node": node, "cell": index,
            "ename": ename, "evalue": evalue, "traceback": lines, "time": now()})
    return 1


def finish(plan_path, exit_code):
    """After the step: merge the ranks' reports left, and record how the job ended."""
    plan = Plan(plan_path)
    try:
        notebook = read_json(plan.output)
    except (OSError, ValueError):
        notebook = read_json(plan.notebook)  # rank 0 never wrote it: the notebook as submitted
        for cell in notebook["cells"]:
            if cell.get("cell_type") == "code":
                cell["outputs"], cell["execution_count"] = [], None
        notebook.setdefault("metadata", {})["podman_hpc"] = {"state": "failed", "cell": None, "errors": []}
    meta = notebook["metadata"].setdefault("podman_hpc", {})
    merged = {"rank-%s.json" % e.get("rank") for e in meta.get("errors", [])}
    for index, output in merge_rank_files(plan, notebook, merged):
        notebook["cells"][index].setdefault("outputs", []).append(output)
    if meta.get("state") == "running":
        meta["state"] = "stopped"  # rank 0 ended without finishing: killed
    if exit_code != 0 and meta.get("state") == "completed":
        meta["state"] = "failed"
    meta["exit_code"] = exit_code
    meta["updated"] = now()
    write_json(plan.output, notebook)
    write_json(plan.progress, progress_of(notebook, plan))
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--finish"]:
        if len(argv) != 3:
            raise SystemExit("usage: nbrunner.py --finish PLAN EXIT_CODE")
        return finish(argv[1], int(argv[2]))
    if not argv:
        raise SystemExit("usage: nbrunner.py PLAN [ARGS...]")
    return run(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main())
