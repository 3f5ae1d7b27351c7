"""Notebook at scale: a notebook converted with nbconvert into a script every rank runs.

nbconvert's PythonExporter turns IPython magics and shell escapes (``%time``,
``!ls``, ``%%bash``) into ``get_ipython()`` calls, which plain ``python3``
cannot run. Two ways to handle them (``JobSpec.notebook_magics``):

- ``"ipython"`` (the default): a notebook with magics runs under IPython
  (``python3 -m IPython <script>``), so they behave as in the notebook; one
  without magics runs under plain ``python3``. The image needs IPython only
  when there are magics (the base image has it, through ipykernel).
- ``"comment"``: every line holding a magic becomes ``pass  # magic: ...``
  and the script runs under plain ``python3``; the magics are reported as
  warnings.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from .script import IPYTHON, PYTHON
from .spec import JobSpecError

_MAGIC_CALL = re.compile(r"get_ipython\(\)")


@dataclass(frozen=True)
class ConvertedNotebook:
    """The script written from a notebook, and how to run it."""

    script: Path
    runner: tuple[str, ...]          # the interpreter command line before the script path
    magics: tuple[str, ...] = ()     # the lines that used IPython, as converted
    warnings: tuple[str, ...] = field(default=())

    @property
    def uses_ipython(self) -> bool:
        return self.runner == tuple(IPYTHON)


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
    except Exception as err:  # nbformat's own validation errors
        raise JobSpecError(f"notebook {path} is not a valid notebook: {err}".splitlines()[0])
    language = (notebook.metadata.get("kernelspec", {}).get("language")
                or notebook.metadata.get("language_info", {}).get("name") or "python")
    if language.lower() != "python":
        raise JobSpecError(f"notebook {path} is a {language} notebook: only Python notebooks run at scale")
    return notebook


def convert(path: str | Path, out_dir: str | Path, *, magics: str = "ipython",
            name: str | None = None) -> ConvertedNotebook:
    """Write ``<out_dir>/<name or the notebook's stem>.py`` from the notebook at ``path``."""
    from nbconvert.exporters import PythonExporter

    notebook = read_notebook(path)
    try:
        code, _ = PythonExporter().from_notebook_node(notebook)
    except Exception as err:
        raise JobSpecError(f"notebook {path} cannot be converted to a script: {err}".splitlines()[0])
    lines = code.splitlines()
    found = tuple(line.strip() for line in lines if _MAGIC_CALL.search(line))
    warnings: list[str] = []
    if magics == "comment" and found:
        lines = [_commented(line) if _MAGIC_CALL.search(line) else line for line in lines]
        warnings.append(f"{len(found)} IPython magic/shell line(s) of {Path(path).name} are commented out "
                        "and will not run")
        runner = tuple(PYTHON)
    elif found:
        runner = tuple(IPYTHON)
    else:
        runner = tuple(PYTHON)
    header = [
        "# Converted by jupyter-podman-hpc from " + str(Path(path).resolve()),
        "# Runs as every rank of the job (SLURM_PROCID tells them apart)"
        + (" under IPython, for its magics." if runner == tuple(IPYTHON) else "."),
    ]
    if lines and lines[0].startswith("#!"):
        lines = lines[1:]
    if lines and re.match(r"#.*coding[:=]", lines[0]):  # a coding line stays first
        header, lines = [lines[0], *header], lines[1:]
    out = Path(out_dir) / f"{name or Path(path).stem}.py"
    text = "\n".join(header + lines) + "\n"
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(text)
    tmp.replace(out)
    return ConvertedNotebook(out, runner, found, tuple(warnings))


def _commented(line: str) -> str:
    indent = line[: len(line) - len(line.lstrip())]
    return f"{indent}pass  # magic (not run): {line.strip()}"
