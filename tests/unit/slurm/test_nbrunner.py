"""The notebook runner as the ranks run it (a subprocess per rank, Slurm's variables set by hand):
the output notebook rank 0 writes (checked with nbformat), errors on rank 0 and on another rank,
a stop by SIGTERM, plain Python without IPython. tests/integration/slurm runs it on the cluster."""

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from jupyter_podman_hpc.slurm.notebook import prepare

PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
BARE_PYTHON = "/usr/bin/python3"  # Debian's, no site packages: no IPython, nbformat or this package


def job(tmp_path, cells, name="nb", **options):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("# Title")] + [
        c if isinstance(c, nbformat.NotebookNode) else nbformat.v4.new_code_cell(c) for c in cells]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    source = tmp_path / f"{name}.ipynb"
    nbformat.write(notebook, str(source))
    directory = tmp_path / "job"
    directory.mkdir()
    prepare(source, directory, **options)
    return directory


def rank(directory, number, size=2, python=sys.executable, wait=True, extra_env=None, args=()):
    env = {"PATH": os.environ["PATH"], "HOME": str(directory), "SLURM_PROCID": str(number),
           "SLURM_NTASKS": str(size), "SLURMD_NODENAME": f"n{number + 1}", "SLURM_JOB_ID": "4242",
           **(extra_env or {})}
    argv = [python, "-u", str(directory / "nbrunner.py"), str(directory / "nbrun" / "plan.json"), *args]
    process = subprocess.Popen(argv, cwd=directory, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    if not wait:
        return process
    out, err = process.communicate(timeout=120)
    return process.returncode, out, err


def finish(directory, code):
    subprocess.run([BARE_PYTHON, str(directory / "nbrunner.py"), "--finish",
                    str(directory / "nbrun" / "plan.json"), str(code)], check=True, timeout=60)


def output(directory, name="nb"):
    text = (directory / f"{name}.out.ipynb").read_text()
    notebook = nbformat.reads(text, as_version=4)
    nbformat.validate(notebook)  # written by hand, valid nbformat 4
    return notebook


def test_rank_0_records_every_kind_of_output_in_its_cell(tmp_path):
    directory = job(tmp_path, [
        "import os\nntasks = int(os.environ['SLURM_NTASKS'])",
        "print('ntasks', ntasks)\nntasks * 21",
        f"from IPython.display import Image, HTML, display\ndisplay(Image(data={PNG!r}))\ndisplay(HTML('<b>hi</b>'))",
        "%%time\ntotal = sum(range(1000))",
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('a line')",
        "import sys\nprint('to stderr', file=sys.stderr)\nsys.argv[1:]",
        "x = 1;",
    ])
    code, out, err = rank(directory, 0, args=("--flag", "v"))
    assert code == 0, err
    assert "ntasks 2" in out and "Wall time" in out  # the rank's log as before
    notebook = output(directory)
    cells = notebook.cells
    assert [c.execution_count for c in cells[1:]] == [1, 2, 3, 4, 5, 6, 7]
    assert cells[2].outputs == [{"output_type": "stream", "name": "stdout", "text": "ntasks 2\n"},
                                {"output_type": "execute_result", "data": {"text/plain": "42"}, "metadata": {},
                                 "execution_count": 2}]
    png, html = cells[3].outputs
    assert base64.b64decode(png.data["image/png"]) == PNG and html.data["text/html"] == "<b>hi</b>"
    assert cells[4].outputs[0].name == "stdout" and "Wall time" in cells[4].outputs[0].text
    figure = [o for o in cells[5].outputs if o.output_type == "display_data"]
    assert len(figure) == 1 and base64.b64decode(figure[0].data["image/png"]).startswith(b"\x89PNG")
    assert cells[6].outputs[0] == {"output_type": "stream", "name": "stderr", "text": "to stderr\n"}
    assert cells[6].outputs[1].data["text/plain"] == "['--flag', 'v']"
    assert cells[7].outputs == []  # a trailing semicolon hides the result
    assert all(c.metadata.podman_hpc.status == "ok" for c in cells[1:])
    meta = notebook.metadata.podman_hpc
    assert (meta.state, meta.job_id, meta.ntasks, meta.errors) == ("completed", "4242", 2, [])
    progress = json.loads((directory / "nbrun" / "progress.json").read_text())
    assert (progress["state"], progress["cell"], progress["code_cells"]) == ("completed", None, 7)


def test_an_error_on_rank_0_stops_it_at_its_cell(tmp_path):
    directory = job(tmp_path, ["print('first')", "def f():\n    return 1 / 0\nf()", "print('never')"])
    code, out, err = rank(directory, 0)
    assert code == 1 and "ZeroDivisionError" in err and "never" not in out
    cells = output(directory).cells
    error = cells[2].outputs[-1]
    assert (error.output_type, error.ename, error.evalue) == ("error", "ZeroDivisionError", "division by zero")
    assert any("return 1 / 0" in line for line in error.traceback)
    assert cells[2].metadata.podman_hpc.status == "error"
    assert cells[3].outputs == [] and cells[3].execution_count is None
    progress = json.loads((directory / "nbrun" / "progress.json").read_text())
    assert progress["state"] == "failed"
    assert progress["errors"] == [{"rank": 0, "node": "n1", "ename": "ZeroDivisionError",
                                   "evalue": "division by zero", "cell": 3}]


def test_an_error_on_another_rank_is_noted_at_its_cell_with_its_traceback(tmp_path):
    directory = job(tmp_path, [
        "import os\nrank = int(os.environ['SLURM_PROCID'])",
        "print('second on', rank)",
        "if rank == 1:\n    raise ValueError(f'rank {rank} is unhappy')\nprint('third on', rank)",
        "print('fourth on', rank)"])
    one = rank(directory, 1)
    assert one[0] == 1 and "fourth" not in one[1] and "ValueError: rank 1 is unhappy" in one[2]
    report = json.loads((directory / "nbrun" / "rank-1.json").read_text())
    assert (report["rank"], report["cell"], report["ename"]) == (1, 3, "ValueError")
    zero = rank(directory, 0)
    assert zero[0] == 0 and "fourth on 0" in zero[1]
    finish(directory, 1)  # the step's exit code: rank 1's
    notebook = output(directory)
    cell = notebook.cells[3]  # the third code cell
    assert cell.outputs[0] == {"output_type": "stream", "name": "stdout", "text": "third on 0\n"}
    error = cell.outputs[1]
    assert (error.output_type, error.ename, error.evalue) == ("error", "ValueError", "rank 1 is unhappy")
    assert error.traceback[0] == "rank 1 (on n2) raised this in this cell and stopped:"
    assert any("raise ValueError" in line for line in error.traceback)
    assert cell.metadata.podman_hpc.rank_errors == [{"rank": 1, "node": "n2", "ename": "ValueError",
                                                     "evalue": "rank 1 is unhappy"}]
    assert notebook.cells[4].outputs[0].text == "fourth on 0\n"
    meta = notebook.metadata.podman_hpc
    assert (meta.state, meta.exit_code) == ("failed", 1)
    assert [(e.rank, e.cell) for e in meta.errors] == [(1, 4)]
    finish(directory, 1)  # again: nothing merged twice
    assert len(output(directory).cells[3].outputs) == 2


def test_sigterm_keeps_the_completed_cells_and_marks_the_running_one(tmp_path):
    directory = job(tmp_path, ["print('done')", "import time\nprint('sleeping', flush=True)\ntime.sleep(60)",
                               "print('never')"])
    process = rank(directory, 0, wait=False)
    deadline = time.monotonic() + 60

    def printed():  # what the sleeping cell printed, once rank 0 wrote it
        try:
            outputs = json.loads((directory / "nb.out.ipynb").read_text())["cells"][2]["outputs"]
        except (OSError, ValueError):
            return ""
        return "".join(o.get("text", "") for o in outputs)
    while "sleeping\n" not in printed():
        assert time.monotonic() < deadline, process.stderr.read() if process.poll() is not None else ""
        time.sleep(0.1)
    # while it runs: the cell is marked running, its output so far is there
    running = output(directory).cells[2]
    assert running.metadata.podman_hpc.status == "running"
    assert "had not finished it" in running.outputs[-1].data["text/plain"]
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=30)
    assert process.returncode == 128 + signal.SIGTERM
    finish(directory, 143)
    notebook = output(directory)
    assert notebook.cells[1].outputs[0].text == "done\n" and notebook.cells[1].metadata.podman_hpc.status == "ok"
    stopped = notebook.cells[2]
    assert stopped.metadata.podman_hpc.status == "stopped"
    assert stopped.outputs[0].text == "sleeping\n"
    assert stopped.outputs[-1].data["text/plain"].startswith("podman-hpc: the job was stopped (SIGTERM) while rank 0")
    assert notebook.cells[3].outputs == [] and notebook.metadata.podman_hpc.state == "stopped"
    assert not [p for p in directory.iterdir() if p.name.endswith(".tmp")]


def test_a_process_a_cell_forks_prints_to_the_log_only(tmp_path):
    directory = job(tmp_path, ["import os, time\npid = os.fork()\nif pid == 0:\n    print('child', flush=True)\n"
                               "    time.sleep(0.2)\n    os._exit(0)\nos.waitpid(pid, 0)\nprint('parent')"])
    code, out, err = rank(directory, 0)
    assert code == 0 and "child\n" in out, err
    assert output(directory).cells[1].outputs == [{"output_type": "stream", "name": "stdout", "text": "parent\n"}]


def test_without_ipython_cells_run_as_plain_python(tmp_path):
    if not Path(BARE_PYTHON).exists():
        pytest.skip("no Debian python3")
    directory = job(tmp_path, [
        "class Shown:\n    def _repr_html_(self):\n        return '<i>shown</i>'\n",
        "Shown()", "import pickle\npickle.loads(pickle.dumps(Shown())).__class__.__name__",
        "print('display', 1)\n1/0"])
    assert json.loads((directory / "nbrun" / "plan.json").read_text())["ipython"] == "prefer"  # _repr_html_
    code, out, err = rank(directory, 0, python=BARE_PYTHON)
    assert code == 1 and "ZeroDivisionError" in err
    cells = output(directory).cells
    assert cells[2].outputs[0].data["text/html"] == "<i>shown</i>"
    assert cells[3].outputs[0].data["text/plain"] == "'Shown'"  # classes of the cells pickle, as in a script
    error = cells[4].outputs[-1]
    assert error.ename == "ZeroDivisionError" and error.traceback[-1] == "ZeroDivisionError: division by zero"
    assert not any("nbrunner" in line for line in error.traceback)


def test_magics_without_ipython_in_the_image_fail_in_one_line(tmp_path):
    if not Path(BARE_PYTHON).exists():
        pytest.skip("no Debian python3")
    directory = job(tmp_path, ["%time x = 1", "print(x)"])
    code, out, err = rank(directory, 0, python=BARE_PYTHON)
    assert code == 1
    first = output(directory).cells[1]
    assert first.outputs[-1].ename == "ImportError"
    assert "uses IPython magics and the image has no IPython" in first.outputs[-1].evalue
    assert "notebook_magics='comment'" in first.outputs[-1].evalue
    # commented out, the same notebook runs there
    other = tmp_path / "comment"
    other.mkdir()
    directory = job(other, ["%time x = 1\nx = 2", "print(x)"], magics="comment")
    code, out, err = rank(directory, 0, python=BARE_PYTHON)
    assert code == 0 and out == "2\n", err


def test_finish_without_an_output_notebook_starts_from_the_submitted_one(tmp_path):
    directory = job(tmp_path, ["print(1)"])
    finish(directory, 125)  # the container never started
    notebook = output(directory)
    assert notebook.metadata.podman_hpc.state == "failed" and notebook.metadata.podman_hpc.exit_code == 125
    assert notebook.cells[1].outputs == []
