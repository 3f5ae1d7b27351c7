"""Rank 0's output notebook (nbrecorder.py), written as the ranks run (a subprocess per rank):
every kind of output in its cell, another rank's error noted at its cell, a stop by SIGTERM,
a process a cell forks. tests/integration/slurm runs it on the cluster."""

import base64
import json
import signal
import time

from tests.helpers.notebook_jobs import finish_job, notebook_job, output_notebook, run_rank

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def test_rank_0_records_every_kind_of_output_in_its_cell(tmp_path):
    directory = notebook_job(
        tmp_path,
        [
            "import os\nntasks = int(os.environ['SLURM_NTASKS'])",
            "print('ntasks', ntasks)\nntasks * 21",
            f"from IPython.display import Image, HTML, display\ndisplay(Image(data={PNG!r}))\n"
            "display(HTML('<b>hi</b>'))",
            "%%time\ntotal = sum(range(1000))",
            "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('a line')",
            "import sys\nprint('to stderr', file=sys.stderr)\nsys.argv[1:]",
            "x = 1;",
        ],
    )
    code, out, err = run_rank(directory, 0, args=("--flag", "v"))
    assert code == 0, err
    assert "ntasks 2" in out and "Wall time" in out  # the rank's log as before
    notebook = output_notebook(directory)
    cells = notebook.cells
    assert [c.execution_count for c in cells[1:]] == [1, 2, 3, 4, 5, 6, 7]
    assert cells[2].outputs == [
        {"output_type": "stream", "name": "stdout", "text": "ntasks 2\n"},
        {"output_type": "execute_result", "data": {"text/plain": "42"}, "metadata": {}, "execution_count": 2},
    ]
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
    progress = json.loads((directory / "out" / "nbrun" / "progress.json").read_text())
    assert (progress["state"], progress["cell"], progress["code_cells"]) == ("completed", None, 7)


def test_an_error_on_another_rank_is_noted_at_its_cell_with_its_traceback(tmp_path):
    directory = notebook_job(
        tmp_path,
        [
            "import os\nrank = int(os.environ['SLURM_PROCID'])",
            "print('second on', rank)",
            "if rank == 1:\n    raise ValueError(f'rank {rank} is unhappy')\nprint('third on', rank)",
            "print('fourth on', rank)",
        ],
    )
    one = run_rank(directory, 1)
    assert one[0] == 1 and "fourth" not in one[1] and "ValueError: rank 1 is unhappy" in one[2]
    report = json.loads((directory / "out" / "nbrun" / "rank-1.json").read_text())
    assert (report["rank"], report["cell"], report["ename"]) == (1, 3, "ValueError")
    zero = run_rank(directory, 0)
    assert zero[0] == 0 and "fourth on 0" in zero[1]
    finish_job(directory, 1)  # the step's exit code: rank 1's
    notebook = output_notebook(directory)
    cell = notebook.cells[3]  # the third code cell
    assert cell.outputs[0] == {"output_type": "stream", "name": "stdout", "text": "third on 0\n"}
    error = cell.outputs[1]
    assert (error.output_type, error.ename, error.evalue) == ("error", "ValueError", "rank 1 is unhappy")
    assert error.traceback[0] == "rank 1 (on n2) raised this in this cell and stopped:"
    assert any("raise ValueError" in line for line in error.traceback)
    assert cell.metadata.podman_hpc.rank_errors == [
        {"rank": 1, "node": "n2", "ename": "ValueError", "evalue": "rank 1 is unhappy"}
    ]
    assert notebook.cells[4].outputs[0].text == "fourth on 0\n"
    meta = notebook.metadata.podman_hpc
    assert (meta.state, meta.exit_code) == ("failed", 1)
    assert [(e.rank, e.cell) for e in meta.errors] == [(1, 4)]
    finish_job(directory, 1)  # again: nothing merged twice
    assert len(output_notebook(directory).cells[3].outputs) == 2


def test_sigterm_keeps_the_completed_cells_and_marks_the_running_one(tmp_path):
    directory = notebook_job(
        tmp_path, ["print('done')", "import time\nprint('sleeping', flush=True)\ntime.sleep(60)", "print('never')"]
    )
    process = run_rank(directory, 0, wait=False)
    deadline = time.monotonic() + 60

    def printed():  # what the sleeping cell printed, once rank 0 wrote it
        try:
            outputs = json.loads((directory / "out" / "nb.out.ipynb").read_text())["cells"][2]["outputs"]
        except (OSError, ValueError):
            return ""
        return "".join(o.get("text", "") for o in outputs)

    while "sleeping\n" not in printed():
        assert time.monotonic() < deadline, process.stderr.read() if process.poll() is not None else ""
        time.sleep(0.1)
    # while it runs: the cell is marked running, its output so far is there
    running = output_notebook(directory).cells[2]
    assert running.metadata.podman_hpc.status == "running"
    assert "had not finished it" in running.outputs[-1].data["text/plain"]
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=30)
    assert process.returncode == 128 + signal.SIGTERM
    finish_job(directory, 143)
    notebook = output_notebook(directory)
    assert notebook.cells[1].outputs[0].text == "done\n" and notebook.cells[1].metadata.podman_hpc.status == "ok"
    stopped = notebook.cells[2]
    assert stopped.metadata.podman_hpc.status == "stopped"
    assert stopped.outputs[0].text == "sleeping\n"
    assert stopped.outputs[-1].data["text/plain"].startswith("podman-hpc: the job was stopped (SIGTERM) while rank 0")
    assert notebook.cells[3].outputs == [] and notebook.metadata.podman_hpc.state == "stopped"
    assert not list((directory / "out").rglob("*.tmp"))


def test_a_process_a_cell_forks_prints_to_the_log_only(tmp_path):
    directory = notebook_job(
        tmp_path,
        [
            "import os, time\npid = os.fork()\nif pid == 0:\n    print('child', flush=True)\n"
            "    time.sleep(0.2)\n    os._exit(0)\nos.waitpid(pid, 0)\nprint('parent')"
        ],
    )
    code, out, err = run_rank(directory, 0)
    assert code == 0 and "child\n" in out, err
    assert output_notebook(directory).cells[1].outputs == [
        {"output_type": "stream", "name": "stdout", "text": "parent\n"}
    ]
