"""Notebook to script: nbconvert's output, and what happens to IPython magics."""

import subprocess
import sys

import nbformat
import pytest

from jupyter_podman_hpc.slurm.notebook import convert
from jupyter_podman_hpc.slurm.script import IPYTHON, PYTHON
from jupyter_podman_hpc.slurm.spec import JobSpecError


def write_notebook(path, cells, language="python"):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("# A title")] + [nbformat.v4.new_code_cell(c) for c in cells]
    notebook.metadata["kernelspec"] = {"name": "k", "display_name": "k", "language": language}
    nbformat.write(notebook, str(path))
    return path


def test_a_plain_notebook_becomes_a_python_script(tmp_path):
    path = write_notebook(tmp_path / "plain.ipynb", ["x = 6 * 7", "print('answer', x)"])
    out = tmp_path / "out"
    out.mkdir()
    converted = convert(path, out)
    assert converted.script == out / "plain.py" and converted.runner == tuple(PYTHON)
    assert converted.magics == () and not converted.uses_ipython
    result = subprocess.run([sys.executable, str(converted.script)], capture_output=True, text=True, check=True)
    assert result.stdout == "answer 42\n"


def test_magics_run_under_ipython_by_default(tmp_path):
    path = write_notebook(tmp_path / "magic.ipynb", ["%time y = 2", "!echo from-the-shell", "print('y', y)"])
    converted = convert(path, tmp_path)
    assert converted.uses_ipython and converted.runner == tuple(IPYTHON)
    assert len(converted.magics) == 2 and all("get_ipython()" in m for m in converted.magics)
    argv = [sys.executable, *IPYTHON[1:], str(converted.script)]
    result = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env={"HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "from-the-shell" in result.stdout and "y 2" in result.stdout


def test_magics_can_be_commented_out_for_images_without_ipython(tmp_path):
    path = write_notebook(tmp_path / "magic.ipynb", [
        "%matplotlib inline\nz = 3", "for i in range(2):\n    !echo {i}", "print('z', z)"])
    converted = convert(path, tmp_path, magics="comment")
    assert converted.runner == tuple(PYTHON) and len(converted.magics) == 2
    assert converted.warnings and "commented out" in converted.warnings[0]
    text = converted.script.read_text()
    assert "get_ipython" not in text.replace("# magic (not run): get_ipython", "")
    result = subprocess.run([sys.executable, str(converted.script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "z 3\n"


def test_only_python_notebooks_and_real_notebooks(tmp_path):
    with pytest.raises(JobSpecError, match="is a R notebook"):
        convert(write_notebook(tmp_path / "r.ipynb", ["1"], language="R"), tmp_path)
    (tmp_path / "broken.ipynb").write_text("{not json")
    with pytest.raises(JobSpecError, match="cannot be read|is not a valid notebook"):
        convert(tmp_path / "broken.ipynb", tmp_path)
    with pytest.raises(JobSpecError, match="does not exist"):
        convert(tmp_path / "missing.ipynb", tmp_path)
