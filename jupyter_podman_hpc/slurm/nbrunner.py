"""Run a notebook cell by cell on every rank of a job; rank 0 writes the executed notebook.

This file and its two siblings (``nbcells.py``: running a cell, plain Python
or IPython; ``nbrecorder.py``: rank 0's output notebook) are copied into the
job directory and run by the image's ``python3``: they use Python's standard
library only, and IPython when the notebook needs it (magics: ``ipython`` is
``require``) or may use it for rich output (``prefer``) and the image has it.
Nothing of jupyter-podman-hpc, no kernel and no nbclient is needed in the image.

    python3 -u JOB_DIR/nbrunner.py PLAN [ARGS...]    every rank, in the container (sys.argv = [NOTEBOOK, *ARGS])
    PYTHON -I -m jupyter_podman_hpc.slurm.nbrunner --finish PLAN EXIT_CODE
                                                     once, after the step, on the batch host

``PLAN`` (``nbrun/plan.json`` in the job directory, written at submit) names
the notebook, the job's output directory (``out``) and the output notebook.
The ranks see the job directory read-only and write only ``out/``. Every rank
runs every code cell in order; a cell that raises stops its rank (exit code
1). Rank 0 writes ``out/<stem>.out.ipynb`` as its cells run. Another rank
that raises writes ``out/nbrun/rank-<N>.json``; rank 0 merges those into the
output notebook at each write, and ``--finish`` merges whatever is left once
every rank has ended (a scancel'd job keeps what rank 0 merged).

``--finish`` runs on the host, from the installed package and never from the
job directory's copy: it takes every name from the host's plan, and reads
what the ranks wrote as data (``nbrecorder``: through directory descriptors,
bounded, never through a link), so code in the image cannot make the host
run anything or write outside ``out/``.
"""

# The image's python3 runs this file, whatever its version: it keeps to what old ones read (no f-strings,
# annotations or :=), so its strings are %-formatted.
# ruff: noqa: UP031

import os
import signal
import sys
import threading

if __package__:  # imported from jupyter_podman_hpc
    from .nbcells import Tee, make_runner
    from .nbrecorder import (
        NOTEBOOK_LIMIT,
        PROGRESS,
        STATE_DIR,
        Recorder,
        is_plain_name,
        merge_rank_files,
        now,
        open_dir,
        progress_of,
        read_json,
        write_json,
    )
else:  # the job directory's copy, run by the image's python3: its siblings are beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # there under python3 -P too
    from nbcells import Tee, make_runner
    from nbrecorder import (
        NOTEBOOK_LIMIT,
        PROGRESS,
        STATE_DIR,
        Recorder,
        is_plain_name,
        merge_rank_files,
        now,
        open_dir,
        progress_of,
        read_json,
        write_json,
    )

    del sys.path[0]  # the cells see the path python3 gave them

PLAN_VERSION = 2  # 2: the ranks write only the job's output directory (the plan's "out")


def plain_name(data, key, path):
    """The plan's ``key``: a file name in the job directory, never a path (no "/", not hidden)."""
    value = data.get(key)
    if not is_plain_name(value):
        raise SystemExit("nbrunner: the %s of plan %s is not a plain file name: %r" % (key, path, value))
    return value


class Plan:
    """plan.json: the notebook and the output notebook's names, made paths in the job directory (the
    plan's directory's parent); ``open`` gives descriptors of the output directory and its ``nbrun``."""

    def __init__(self, path):
        data = read_json(path)
        if not isinstance(data, dict) or data.get("version") != PLAN_VERSION:
            raise SystemExit("nbrunner: %s is not a plan of this runner" % path)
        self.path = os.path.abspath(path)
        self.job_dir = os.path.dirname(os.path.dirname(self.path))
        self.notebook = os.path.join(self.job_dir, plain_name(data, "notebook", path))
        self.out_dir = os.path.join(self.job_dir, plain_name(data, "out", path))
        self.output_name = plain_name(data, "output", path)
        self.output = os.path.join(self.out_dir, self.output_name)
        self.ipython = data.get("ipython", "never")
        self.code = {int(k): v for k, v in data.get("code", {}).items()}
        self.out_fd = self.state_fd = None

    def open(self, repair=False):
        """Open the output directory and its ``nbrun`` (never through a link); with ``repair`` (the
        finish), an ``nbrun`` that is not a directory (a link the image planted) is replaced by one."""
        self.out_fd = open_dir(self.out_dir)
        try:
            self.state_fd = open_dir(STATE_DIR, dir_fd=self.out_fd)
        except OSError:
            if not repair:
                raise
            try:
                os.unlink(STATE_DIR, dir_fd=self.out_fd)  # a link or a file: removed, never followed
            except FileNotFoundError:
                pass
            os.mkdir(STATE_DIR, 0o700, dir_fd=self.out_fd)
            self.state_fd = open_dir(STATE_DIR, dir_fd=self.out_fd)
        return self


def cell_source(cell):
    """A cell's source as one string (nbformat allows a list of lines)."""
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


# --- the two entry points -----------------------------------------------------------------------


def run(plan_path, args):
    """Run the notebook of the plan at ``plan_path`` as this rank (``SLURM_PROCID``), ``args`` as its
    ``sys.argv``: its code cells in order, rank 0 recording the output notebook; stops at the first cell
    that raises. The exit code: 0, or 1 when a cell failed."""
    plan = Plan(plan_path).open()
    rank, size = _rank_and_size()
    notebook = read_json(plan.notebook)
    sys.argv = [plan.notebook, *args]
    recorder = _start_recorder(plan, notebook, rank, size)
    sys.stdout = Tee(sys.stdout, "stdout", recorder)
    sys.stderr = Tee(sys.stderr, "stderr", recorder)
    runner = make_runner(plan, recorder)
    if isinstance(runner, SystemExit):
        return _without_ipython(plan, recorder, rank, runner, notebook)
    for count, (index, code) in enumerate(_code_cells(plan, notebook), 1):
        failure = _run_cell(runner, recorder, index, code, count)
        if failure is not None:
            return end(plan, recorder, rank, index, failure, notebook)
    _record_finished(recorder)
    return 0


def _rank_and_size():
    rank = int(os.environ.get("SLURM_PROCID", os.environ.get("PMI_RANK", "0")) or 0)
    size = int(os.environ.get("SLURM_NTASKS", "1") or 1)
    return rank, size


def _start_recorder(plan, notebook, rank, size):
    """Rank 0's recorder, written once and then flushed on its own thread; None on the other ranks."""
    if rank != 0:
        return None
    recorder = Recorder(plan, notebook, rank, size)
    signal.signal(signal.SIGTERM, recorder.on_signal)  # scancel, or the time limit
    recorder.write()
    threading.Thread(target=recorder.flush_forever, name="nbrunner-flush", daemon=True).start()
    return recorder


def _without_ipython(plan, recorder, rank, missing, notebook):
    """IPython is required and the image has none: the first code cell fails with ``missing``'s message."""
    failure = ("ImportError", str(missing), [str(missing)])
    first = next((i for i, c in enumerate(notebook["cells"]) if c.get("cell_type") == "code"), None)
    return end(plan, recorder, rank, first, failure, notebook)


def _code_cells(plan, notebook):
    """(index, code) of each code cell with code to run, the plan's code (magics commented out) first."""
    for index, cell in enumerate(notebook["cells"]):
        if cell.get("cell_type") != "code":
            continue
        code = plan.code.get(index, cell_source(cell))
        if code.strip():
            yield index, code


def _run_cell(runner, recorder, index, code, count):
    """Run one cell, recorded on rank 0; None, or its failure."""
    if recorder is not None:
        recorder.start(index, count)
    try:
        failure = runner.run(code, index)
    except SystemExit:  # sys.exit(0) in a cell: the notebook ends there, as a script would
        if recorder is not None:
            recorder.end("ok")
        _record_finished(recorder)
        raise
    sys.stdout.flush()
    sys.stderr.flush()
    if failure is None and recorder is not None:
        recorder.end("ok")
    return failure


def _record_finished(recorder):
    """Rank 0's record of a notebook that ran to its end (or to a ``sys.exit(0)``)."""
    if recorder is not None:
        recorder.write(state="failed" if recorder.meta["errors"] else "completed")


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
            recorder.meta["errors"].append(
                {"rank": 0, "node": node, "ename": ename, "evalue": evalue, "cell": index + 1}
            )
        recorder.write(state="failed")
    else:
        write_json(
            "rank-%d.json" % rank,
            {
                "rank": rank,
                "node": node,
                "cell": index,
                "ename": ename,
                "evalue": evalue,
                "traceback": lines,
                "time": now(),
            },
            dir_fd=plan.state_fd,
        )
    return 1


def finish(plan_path, exit_code):
    """After the step, on the host: merge the ranks' reports left, and record how the job ended. What
    the ranks wrote is data: an output notebook that is not one is replaced by the submitted notebook."""
    plan = Plan(plan_path).open(repair=True)
    try:
        notebook = ended(plan, read_json(plan.output_name, NOTEBOOK_LIMIT, dir_fd=plan.out_fd), exit_code)
        progress = progress_of(notebook, plan)
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        notebook = ended(plan, submitted(plan), exit_code)  # rank 0 never wrote it, or not as a notebook
        progress = progress_of(notebook, plan)
    write_json(plan.output_name, notebook, dir_fd=plan.out_fd)
    write_json(PROGRESS, progress, dir_fd=plan.state_fd)
    return 0


def submitted(plan):
    """The notebook as submitted (the job directory's copy), without outputs, marked failed."""
    notebook = read_json(plan.notebook)
    for cell in notebook["cells"]:
        if cell.get("cell_type") == "code":
            cell["outputs"], cell["execution_count"] = [], None
    notebook.setdefault("metadata", {})["podman_hpc"] = {"state": "failed", "cell": None, "errors": []}
    return notebook


def ended(plan, notebook, exit_code):
    """``notebook`` with the reports of the ranks not merged yet, its state and the step's exit code."""
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
    return notebook


def main(argv=None):
    """The runner's command line: ``nbrunner.py PLAN [ARGS...]`` runs the notebook, ``nbrunner.py --finish
    PLAN EXIT_CODE`` ends its record once all ranks are done; the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--finish"]:
        if len(argv) != 3:
            raise SystemExit("usage: python3 -I -m jupyter_podman_hpc.slurm.nbrunner --finish PLAN EXIT_CODE")
        return finish(argv[1], int(argv[2]))
    if not argv:
        raise SystemExit("usage: nbrunner.py PLAN [ARGS...]")
    return run(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main())
