"""The notebook runner's entry points (nbrunner.py): a rank that raises stops at its cell, the
finish after the step, and the runner's modules found beside it however python3 sets its path."""

import json

from tests.unit.slurm.conftest import finish_job, notebook_job, output_notebook, run_rank


def test_an_error_on_rank_0_stops_it_at_its_cell(tmp_path):
    directory = notebook_job(tmp_path, ["print('first')", "def f():\n    return 1 / 0\nf()", "print('never')"])
    code, out, err = run_rank(directory, 0)
    assert code == 1 and "ZeroDivisionError" in err and "never" not in out
    cells = output_notebook(directory).cells
    error = cells[2].outputs[-1]
    assert (error.output_type, error.ename, error.evalue) == ("error", "ZeroDivisionError", "division by zero")
    assert any("return 1 / 0" in line for line in error.traceback)
    assert cells[2].metadata.podman_hpc.status == "error"
    assert cells[3].outputs == [] and cells[3].execution_count is None
    progress = json.loads((directory / "nbrun" / "progress.json").read_text())
    assert progress["state"] == "failed"
    assert progress["errors"] == [{"rank": 0, "node": "n1", "ename": "ZeroDivisionError",
                                   "evalue": "division by zero", "cell": 3}]


def test_finish_without_an_output_notebook_starts_from_the_submitted_one(tmp_path):
    directory = notebook_job(tmp_path, ["print(1)"])
    finish_job(directory, 125)  # the container never started
    notebook = output_notebook(directory)
    assert notebook.metadata.podman_hpc.state == "failed" and notebook.metadata.podman_hpc.exit_code == 125
    assert notebook.cells[1].outputs == []


def test_the_runner_finds_its_modules_beside_it_and_leaves_the_path_to_the_cells(tmp_path):
    directory = notebook_job(tmp_path, ["import os, sys\n"
                                        "print(any(os.path.isfile(os.path.join(p or '.', 'nbcells.py')) for p in sys.path))"])
    code, out, err = run_rank(directory, 0, size=1)
    assert (code, out) == (0, "True\n"), err  # python3 script.py: the script's directory first, as ever
    code, out, err = run_rank(directory, 0, size=1, extra_env={"PYTHONSAFEPATH": "1"})  # python3 -P
    assert (code, out) == (0, "False\n"), err
