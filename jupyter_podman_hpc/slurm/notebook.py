"""Notebook at scale: a notebook every rank runs cell by cell, and the executed notebook it gives back.

At submit, ``prepare`` puts into the job directory the notebook (with the
job's parameters injected after its cell tagged ``parameters``, papermill's
convention), the runner (``nbrunner.py`` and its modules ``nbcells.py`` and
``nbrecorder.py``, Python's standard library only) and ``nbrun/plan.json``
(what the runner runs), all read-only to the ranks. Every rank runs the
notebook; rank 0 writes ``out/<stem>.out.ipynb`` as its cells run, and its
progress in ``out/nbrun/`` (see ``nbrunner``). After the step the host runs
the installed package's runner (``--finish``), never the job directory's copy.

IPython magics and shell escapes (``%time``, ``!ls``, ``%%bash``) are found
with IPython's own input transformer. ``JobSpec.notebook_magics``:

- ``"ipython"`` (the default): a notebook with magics runs under IPython
  (the image needs it; the base image has it, through ipykernel). One without
  runs under IPython too when the image has it and the notebook displays
  things (it mentions ``display``, ``IPython`` or ``matplotlib``), else under
  plain Python.
- ``"comment"``: every line holding a magic becomes ``pass  # magic: ...``
  and runs without IPython; the magics are reported as warnings.

``output_info`` and ``read_output`` read back what a job's runner has written
so far: files the image could have written, so as data (``files.read_untrusted``:
bounded, never through a link), the output notebook through nbformat's reader,
which drops every cell's ``trusted`` mark. Job directories of older versions
(no ``out`` in their record's ``run``) hold the output notebook at their top.
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISREG

from ..engine.base.files import UntrustedFile, read_untrusted
from ..engine.errors import EngineError
from ..engine.text import human_bytes
from .nbrecorder import PROGRESS, STATE_DIR, is_plain_name
from .script import OUT_DIR, PYTHON, RunTarget, finish_argv
from .spec import JobSpecError, check_parameters

_MAGIC_CALL = re.compile(r"get_ipython\(\)")
# A notebook that mentions one of these probably displays rich output: IPython is used when there.
_DISPLAY_HINT = re.compile(r"\b(display|IPython|matplotlib|_repr_\w+_)\b")
RUNNER = "nbrunner.py"
RUNNER_FILES = (RUNNER, "nbcells.py", "nbrecorder.py")  # copied into the job directory, side by side
PLAN = "plan.json"  # in STATE_DIR of the job directory (the host's); the ranks' state is in that of out/
PARAMETERS_TAG = "parameters"
INJECTED_TAG = "injected-parameters"
OUTPUT_LIMIT = 64 << 20  # bytes of an output notebook the server reads (images included)
PROGRESS_LIMIT = 1 << 20


class OutputTooLarge(EngineError):
    """The output notebook is larger than the server reads (``OUTPUT_LIMIT``)."""


@dataclass(frozen=True)
class PreparedNotebook:
    """A notebook put into a job directory, and how its ranks run it."""

    notebook: str  # the notebook's name in the job directory
    output: str  # the executed notebook rank 0 writes there
    ipython: str  # require, prefer or never
    magics: tuple[str, ...] = ()  # the lines that use IPython, as IPython transforms them
    warnings: tuple[str, ...] = field(default=())


def read_notebook(path: str | Path):
    """The notebook at ``path`` (nbformat 4), checked to be a Python notebook."""
    import nbformat

    path = Path(path)
    try:
        notebook = nbformat.read(str(path), as_version=4)
    except FileNotFoundError:
        raise JobSpecError(f"notebook {path} does not exist")
    except (OSError, ValueError, json.JSONDecodeError) as err:
        raise JobSpecError(f"notebook {path} cannot be read: {err}".splitlines()[0])
    except Exception as err:  # noqa: BLE001  nbformat's validation errors (jsonschema's) and its converters'
        raise JobSpecError(f"notebook {path} is not a valid notebook: {err}".splitlines()[0])
    language = (
        notebook.metadata.get("kernelspec", {}).get("language")
        or notebook.metadata.get("language_info", {}).get("name")
        or "python"
    )
    if language.lower() != "python":
        raise JobSpecError(f"notebook {path} is a {language} notebook: only Python notebooks run at scale")
    return notebook


# --- parameters -----------------------------------------------------------------------------------


def inject_parameters(notebook, parameters: Mapping[str, str]) -> str | None:
    """Papermill's convention: a cell tagged ``injected-parameters`` after the one tagged
    ``parameters`` (first if there is none); an earlier injected cell is replaced. A warning or None."""
    import nbformat

    notebook.cells = [c for c in notebook.cells if INJECTED_TAG not in c.get("metadata", {}).get("tags", [])]
    if not parameters:
        return None
    lines = ["# Parameters (injected at submit)"] + [f"{name} = {value}" for name, value in parameters.items()]
    cell = nbformat.v4.new_code_cell("\n".join(lines), metadata={"tags": [INJECTED_TAG]})
    tagged = [i for i, c in enumerate(notebook.cells) if PARAMETERS_TAG in c.get("metadata", {}).get("tags", [])]
    if tagged:
        notebook.cells.insert(tagged[0] + 1, cell)
        return None
    notebook.cells.insert(0, cell)
    return "no cell is tagged 'parameters': the parameters are set in a new first cell"


# --- preparing a job directory --------------------------------------------------------------------


def _magic_lines(code: str) -> tuple[str, list[str]]:
    """The cell as IPython transforms it, and its lines that call IPython."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        transformed = TransformerManager().transform_cell(code)
    except Exception:  # noqa: BLE001 - left to Python to report at its cell, as a script would
        return code, []
    return transformed, [line.strip() for line in transformed.splitlines() if _MAGIC_CALL.search(line)]


def _commented(line: str) -> str:
    indent = line[: len(line) - len(line.lstrip())]
    return f"{indent}pass  # magic (not run): {line.strip()}"


@dataclass
class _MagicScan:
    """What the code cells of a notebook hold: their IPython lines, their commented-out code
    (by cell index, with ``magics="comment"``) and whether any hints at rich display."""

    found: list[str] = field(default_factory=list)
    code: dict[str, str] = field(default_factory=dict)
    hints: bool = False


def _scan_cells(cells, magics: str) -> _MagicScan:
    """Every code cell's magics, in order."""
    scan = _MagicScan()
    for index, cell in enumerate(cells):
        if cell.cell_type == "code":
            _scan_cell(scan, str(index), cell.source, magics)
    return scan


def _scan_cell(scan: _MagicScan, key: str, source: str, magics: str) -> None:
    transformed, lines = _magic_lines(source)
    scan.found += lines
    scan.hints = scan.hints or bool(_DISPLAY_HINT.search(source))
    if magics == "comment" and lines:
        scan.code[key] = (
            "\n".join(_commented(line) if _MAGIC_CALL.search(line) else line for line in transformed.splitlines())
            + "\n"
        )


def _ipython_mode(scan: _MagicScan, magics: str) -> str:
    """require (magics run under IPython), prefer (the notebook displays things) or never."""
    if scan.found and magics == "ipython":
        return "require"
    return "prefer" if scan.hints else "never"


def _give_cell_ids(notebook) -> None:
    """nbformat 4.5, and an id for every cell that has none."""
    if notebook.nbformat_minor < 5:  # cell ids: nbformat 4.5
        notebook.nbformat_minor = 5
    for cell in notebook.cells:
        if not cell.get("id"):
            cell["id"] = uuid.uuid4().hex[:8]


def _install_runner(staging: Path, plan: dict) -> None:
    """The runner's files, its plan (``plan`` after the plan's version) and the ranks' out directories."""
    for runner_file in RUNNER_FILES:
        shutil.copyfile(Path(__file__).with_name(runner_file), staging / runner_file)
    state = staging / STATE_DIR
    state.mkdir(0o700)
    # not imported with this module: the package's __init__ imports it, and the finish runs nbrunner with -m
    from .nbrunner import PLAN_VERSION

    (state / PLAN).write_text(json.dumps({"version": PLAN_VERSION, **plan}, indent=1) + "\n")
    (staging / OUT_DIR).mkdir(0o700, exist_ok=True)  # made by the job's submit, or here for the runner alone
    (staging / OUT_DIR / STATE_DIR).mkdir(0o700)


def prepare(
    source: str | Path, staging: Path, *, magics: str = "ipython", parameters: Mapping[str, str] | None = None
) -> PreparedNotebook:
    """Write the notebook (parameters injected), the runner and its plan into ``staging``."""
    import nbformat

    source = Path(source)
    notebook = read_notebook(source)
    injected = inject_parameters(notebook, parameters or {})
    warnings = [injected] if injected else []
    _give_cell_ids(notebook)
    scan = _scan_cells(notebook.cells, magics)
    if magics == "comment" and scan.found:
        warnings.append(
            f"{len(scan.found)} IPython magic/shell line(s) of {source.name} are commented out and will not run"
        )
    ipython = _ipython_mode(scan, magics)
    name = f"{source.stem}.ipynb"
    output = f"{source.stem}.out.ipynb"
    nbformat.write(notebook, str(staging / name))
    _install_runner(
        staging, {"notebook": name, "out": OUT_DIR, "output": output, "ipython": ipython, "code": scan.code}
    )
    return PreparedNotebook(name, output, ipython, tuple(scan.found), tuple(warnings))


def target(spec, staging: Path, directory: Path) -> tuple[RunTarget, dict]:
    """The run target and job record entry of a notebook spec, its inputs prepared in ``staging``."""
    source = Path(spec.notebook).expanduser()
    if not source.is_file():
        raise JobSpecError(f"notebook {source} does not exist or is not a file")
    prepared = prepare(source, staging, magics=spec.notebook_magics, parameters=spec.parameters)
    plan = str(directory / STATE_DIR / PLAN)
    argv = (*PYTHON, str(directory / RUNNER), plan, *spec.args)
    how = {
        "require": "under IPython (it uses magics)",
        "prefer": "under IPython where the image has it",
        "never": "under python3",
    }[prepared.ipython]
    note = (
        f"Notebook {source.name} run cell by cell by {RUNNER} on every rank, {how}; "
        f"rank 0 writes {OUT_DIR}/{prepared.output}."
    )
    return RunTarget(argv, "notebook", note, finish_argv(plan)), {
        "kind": "notebook",
        "argv": list(argv),
        "source": str(source.resolve()),
        "inputs": [prepared.notebook, *RUNNER_FILES],
        "out": OUT_DIR,
        "output": prepared.output,
        "ipython": prepared.ipython,
        "magics": list(prepared.magics),
        "warnings": list(prepared.warnings),
        "parameters": dict(spec.parameters),
    }


# --- reading back ---------------------------------------------------------------------------------


def output_info(directory: str | Path, run: Mapping) -> dict | None:
    """A notebook job's output notebook: its path, whether rank 0 has written it yet, and
    its progress (the cell rank 0 is in, the errors of every rank so far); None for other jobs.

    The output is in the job's ``out/`` (the record's ``run["out"]``), or at the top of the job
    directory of an older version. Nothing there is followed through a link."""
    name, out = run.get("output"), run.get("out")
    if run.get("kind") != "notebook" or not is_plain_name(name) or (out is not None and not is_plain_name(out)):
        return None  # not a notebook job (or a record this version did not write: a name, never a path)
    directory = Path(directory)
    where = directory / out if out is not None else directory
    path = where / name
    info: dict = {"name": name, "path": str(path), "exists": False, "size": None, "modified": None, "progress": None}
    try:
        stat = path.lstat()
        if S_ISREG(stat.st_mode):
            info.update(exists=True, size=stat.st_size, modified=stat.st_mtime)
    except OSError:
        pass
    try:
        progress = json.loads(read_untrusted(where / STATE_DIR / PROGRESS, PROGRESS_LIMIT, beneath=directory))
        if isinstance(progress, dict):
            info["progress"] = progress
    except (OSError, ValueError):
        pass
    return info


def _describe_errors(errors: list, short: bool) -> str:
    """Which cell failed on which rank, with the error unless ``short``."""
    if short:
        return "; ".join(f"cell {e.get('cell')} failed on rank {e.get('rank')}" for e in errors)
    return "; ".join(
        f"cell {e.get('cell')} failed on rank {e.get('rank')}: {e.get('ename')}: {e.get('evalue')}" for e in errors
    )


def _describe_cell(progress: dict, short: bool) -> str:
    """The cell rank 0 is in, of how many."""
    if short:
        return f"cell {progress['cell']}/{progress.get('cells')}"
    return f"rank 0 is in cell {progress['cell']} of {progress.get('cells')}"


def describe_progress(info: dict | None, short: bool = False) -> str:
    """One line for the magic: where rank 0 is, or which cell failed on which rank (``short``:
    without the errors' messages, for a table)."""
    if not info or not info.get("progress"):
        return ""
    progress = info["progress"]
    errors = progress.get("errors") or []
    if errors:
        return _describe_errors(errors, short)
    state = progress.get("state")
    if state == "running" and progress.get("cell"):
        return _describe_cell(progress, short)
    return state or ""


def read_output(info: dict) -> dict:
    """The output notebook (for the REST API), read as nbformat reads a notebook: no cell of it
    trusted, whatever the file says (code in the image could have written it). FileNotFoundError
    until rank 0 wrote it; UntrustedFile (an OSError) for a link or a FIFO; ValueError for what is
    not a notebook; OutputTooLarge over ``OUTPUT_LIMIT``."""
    import nbformat

    try:
        data = read_untrusted(info["path"], OUTPUT_LIMIT)
    except UntrustedFile as err:
        if err.size is None:
            raise
        raise OutputTooLarge(
            f"the output notebook {info['name']} is {human_bytes(err.size)}, more than the "
            f"{human_bytes(OUTPUT_LIMIT)} shown here: open it from {info['path']}"
        ) from None
    try:
        return nbformat.reads(data.decode("utf-8", errors="replace"), as_version=4)
    except Exception as err:  # noqa: BLE001 - nbformat's errors for what is not a notebook are of every kind
        raise ValueError(f"{info['name']} is not a notebook: {err}".splitlines()[0]) from None


__all__ = [
    "RUNNER",
    "RUNNER_FILES",
    "STATE_DIR",
    "OutputTooLarge",
    "PreparedNotebook",
    "check_parameters",
    "describe_progress",
    "inject_parameters",
    "output_info",
    "prepare",
    "read_notebook",
    "read_output",
    "target",
]
