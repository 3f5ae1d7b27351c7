"""Running the cells (nbcells.py): as plain Python in an image without IPython, where a notebook
with magics fails in one line unless they are commented out."""

import json
from pathlib import Path

import pytest

from tests.helpers.notebook_jobs import BARE_PYTHON, notebook_job, output_notebook, run_rank


def test_without_ipython_cells_run_as_plain_python(tmp_path):
    if not Path(BARE_PYTHON).exists():
        pytest.skip("no Debian python3")
    directory = notebook_job(
        tmp_path,
        [
            "class Shown:\n    def _repr_html_(self):\n        return '<i>shown</i>'\n",
            "Shown()",
            "import pickle\npickle.loads(pickle.dumps(Shown())).__class__.__name__",
            "print('display', 1)\n1/0",
        ],
    )
    assert json.loads((directory / "nbrun" / "plan.json").read_text())["ipython"] == "prefer"  # _repr_html_
    code, _out, err = run_rank(directory, 0, python=BARE_PYTHON)
    assert code == 1 and "ZeroDivisionError" in err
    cells = output_notebook(directory).cells
    assert cells[2].outputs[0].data["text/html"] == "<i>shown</i>"
    assert cells[3].outputs[0].data["text/plain"] == "'Shown'"  # classes of the cells pickle, as in a script
    error = cells[4].outputs[-1]
    assert error.ename == "ZeroDivisionError" and error.traceback[-1] == "ZeroDivisionError: division by zero"
    assert not any("nbrunner" in line for line in error.traceback)


def test_magics_without_ipython_in_the_image_fail_in_one_line(tmp_path):
    if not Path(BARE_PYTHON).exists():
        pytest.skip("no Debian python3")
    directory = notebook_job(tmp_path, ["%time x = 1", "print(x)"])
    code, out, err = run_rank(directory, 0, python=BARE_PYTHON)
    assert code == 1
    first = output_notebook(directory).cells[1]
    assert first.outputs[-1].ename == "ImportError"
    assert "uses IPython magics and the image has no IPython" in first.outputs[-1].evalue
    assert "notebook_magics='comment'" in first.outputs[-1].evalue
    # commented out, the same notebook runs there
    other = tmp_path / "comment"
    other.mkdir()
    directory = notebook_job(other, ["%time x = 1\nx = 2", "print(x)"], magics="comment")
    code, out, err = run_rank(directory, 0, python=BARE_PYTHON)
    assert code == 0 and out == "2\n", err
