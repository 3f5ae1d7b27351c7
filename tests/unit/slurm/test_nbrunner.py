"""The notebook runner's entry points (nbrunner.py): a rank that raises stops at its cell, the
finish after the step, and the runner's modules found beside it however python3 sets its path.
The finish, on the host, takes its names from the host's plan and writes only in out/, whatever
the image planted there; rank 0 replaces a planted link rather than write through it."""

import json
import os
import subprocess

import pytest

from jupyter_podman_hpc.slurm.script import finish_argv
from tests.helpers.notebook_jobs import finish_job, notebook_job, output_notebook, run_rank


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
    progress = json.loads((directory / "out" / "nbrun" / "progress.json").read_text())
    assert progress["state"] == "failed"
    assert progress["errors"] == [
        {"rank": 0, "node": "n1", "ename": "ZeroDivisionError", "evalue": "division by zero", "cell": 3}
    ]


def test_finish_without_an_output_notebook_starts_from_the_submitted_one(tmp_path):
    directory = notebook_job(tmp_path, ["print(1)"])
    finish_job(directory, 125)  # the container never started
    notebook = output_notebook(directory)
    assert notebook.metadata.podman_hpc.state == "failed" and notebook.metadata.podman_hpc.exit_code == 125
    assert notebook.cells[1].outputs == []


def test_the_runner_finds_its_modules_beside_it_and_leaves_the_path_to_the_cells(tmp_path):
    directory = notebook_job(
        tmp_path, ["import os, sys\nprint(any(os.path.isfile(os.path.join(p or '.', 'nbcells.py')) for p in sys.path))"]
    )
    code, out, err = run_rank(directory, 0, size=1)
    assert (code, out) == (0, "True\n"), err  # python3 script.py: the script's directory first, as ever
    code, out, err = run_rank(directory, 0, size=1, extra_env={"PYTHONSAFEPATH": "1"})  # python3 -P
    assert (code, out) == (0, "False\n"), err


def test_the_finish_writes_only_in_out_whatever_the_image_planted_there(tmp_path):
    directory = notebook_job(tmp_path, ["print(1)"])
    home = tmp_path / "home"
    (home / "state").mkdir(parents=True)
    bashrc = home / ".bashrc"
    bashrc.write_text("# the user's\n")
    out = directory / "out"
    os.rmdir(out / "nbrun")
    (out / "nbrun").symlink_to(home / "state")  # progress.json would land in $HOME
    (out / "nb.out.ipynb").symlink_to(bashrc)  # the output notebook would overwrite .bashrc
    finish_job(directory, 1)
    assert bashrc.read_text() == "# the user's\n" and list((home / "state").iterdir()) == []
    assert not (out / "nbrun").is_symlink() and (out / "nbrun" / "progress.json").is_file()
    notebook = output_notebook(directory)  # the link was not read: the submitted notebook, marked failed
    assert notebook.metadata.podman_hpc.state == "failed" and notebook.cells[1].outputs == []
    assert sorted(p.name for p in out.iterdir()) == ["nb.out.ipynb", "nbrun"]


def test_rank_0_replaces_a_link_planted_at_the_output_notebook_rather_than_write_through_it(tmp_path):
    directory = notebook_job(tmp_path, ["print('ran')"])
    victim = tmp_path / "victim"
    victim.write_text("kept")
    (directory / "out" / "nb.out.ipynb").symlink_to(victim)
    code, _out, err = run_rank(directory, 0, size=1)
    assert code == 0, err
    assert victim.read_text() == "kept" and output_notebook(directory).cells[1].outputs[0].text == "ran\n"


@pytest.mark.parametrize("output", ["/home/u/.bashrc", "../job.sh", ".hidden", "a/b"])
def test_the_finish_refuses_a_plan_whose_output_is_not_a_plain_name(tmp_path, output):
    directory = notebook_job(tmp_path, ["print(1)"])
    plan_path = directory / "nbrun" / "plan.json"
    plan = json.loads(plan_path.read_text())
    plan_path.write_text(json.dumps({**plan, "output": output}))
    argv = [*finish_argv(str(plan_path)), "0"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stderr == (
        f"nbrunner: the output of plan {plan_path} is not a plain file name: {output!r}\n"
    )
    assert list((directory / "out").iterdir()) == [directory / "out" / "nbrun"]


def test_the_finish_reads_the_ranks_reports_as_data(tmp_path):
    directory = notebook_job(tmp_path, ["print(1)"])
    state = directory / "out" / "nbrun"
    report = {"rank": 1, "node": "n2", "cell": 1, "ename": "ValueError", "evalue": "bad", "traceback": ["t"]}
    (state / "rank-1.json").write_text(json.dumps(report))
    (state / "rank-2.json").symlink_to("/dev/zero")
    os.mkfifo(state / "rank-3.json")
    (state / "rank-4.json").write_text(json.dumps({**report, "rank": 4, "traceback": ["x" * (1 << 20)]}))
    (state / "rank-5.json").write_text(json.dumps({**report, "rank": 5, "traceback": 7}))
    (state / "rank-6.json").write_text("{not json")
    finish_job(directory, 1)
    notebook = output_notebook(directory)
    assert [e.rank for e in notebook.metadata.podman_hpc.errors] == [1]
    assert [o.ename for o in notebook.cells[1].outputs] == ["ValueError"]
