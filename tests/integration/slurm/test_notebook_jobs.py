"""Notebooks at scale on the 4-node cluster bring back the executed notebook: each output at its
cell with the parameters given at submit, another rank's error at its cell, and what a scancel'd
job did, with the cell it was in marked. The runner runs in the base image (Debian's python3 and
IPython 8, no nbclient, no kernel, not this package)."""

import base64
import json
import time

from jupyter_podman_hpc.slurm import Job
from jupyter_podman_hpc.slurm.notebook import describe_progress
from tests.integration.slurm.notebooks import TIMEOUT, executed, notebook_file, notebook_spec

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def test_a_2_node_notebook_comes_back_executed_with_its_parameters(squashed_base, stack, root):
    path = notebook_file(
        root / "Study.ipynb",
        [
            "greeting = 'default'\nrepeat = 1",
            "import os\nprint('ntasks', os.environ['SLURM_NTASKS'])",
            f"from IPython.display import Image, display\ndisplay(Image(data={PNG!r}))",
            "%%time\ntotal = sum(range(10_000))",
            "print(greeting * repeat)",
        ],
        tags={0: "parameters"},
    )
    job = Job.submit(
        notebook_spec(stack, squashed_base, path, parameters={"greeting": "'hello '", "repeat": "2"}), root / "jobs"
    )
    status = job.wait(timeout=TIMEOUT, poll_interval=0.5)
    assert (status.state, status.exit_code) == ("COMPLETED", 0), (status, job.logs("err"), job.batch_log())
    cells = executed(job).cells
    assert cells[1].metadata["tags"] == ["injected-parameters"] and "greeting = 'hello '" in cells[1].source
    assert cells[2].outputs == [{"output_type": "stream", "name": "stdout", "text": "ntasks 2\n"}]
    image = cells[3].outputs[0]
    assert image.output_type == "display_data" and base64.b64decode(image.data["image/png"]) == PNG
    assert "Wall time" in cells[4].outputs[0].text
    assert cells[5].outputs[0].text == "hello hello \n"
    assert [c.metadata.podman_hpc.status for c in cells[1:]] == ["ok"] * 5
    assert executed(job).metadata.podman_hpc.state == "completed"
    assert job.output_notebook()["progress"]["state"] == "completed"
    # every rank ran it: rank 1's log has its output
    assert "ntasks 2" in job.logs()[1] and "hello hello" in job.logs()[1]


def test_a_cell_raising_on_rank_1_only_fails_the_job_and_is_marked_with_its_traceback(squashed_base, stack, root):
    path = notebook_file(
        root / "Uneven.ipynb",
        [
            "import os\nrank = int(os.environ['SLURM_PROCID'])",
            "print('second on', rank)",
            "if rank == 1:\n    raise RuntimeError('only rank 1 fails here')\nprint('third on', rank)",
            "print('fourth on', rank)",
        ],
    )
    job = Job.submit(notebook_spec(stack, squashed_base, path), root / "jobs")
    status = job.wait(timeout=TIMEOUT, poll_interval=0.5)
    assert (status.state, status.exit_code) == ("FAILED", 1), (status, job.batch_log())
    notebook = executed(job)
    third = notebook.cells[2]
    errors = [o for o in third.outputs if o.output_type == "error"]
    assert len(errors) == 1 and errors[0].ename == "RuntimeError" and errors[0].evalue == "only rank 1 fails here"
    assert errors[0].traceback[0].startswith("rank 1 (on n2) raised this in this cell")
    assert any("raise RuntimeError" in line for line in errors[0].traceback)
    assert third.metadata.podman_hpc.rank_errors[0]["rank"] == 1
    assert notebook.cells[3].outputs[0].text == "fourth on 0\n"  # rank 0 went on
    assert notebook.metadata.podman_hpc.state == "failed" and notebook.metadata.podman_hpc.exit_code == 1
    assert describe_progress(job.output_notebook()) == ("cell 3 failed on rank 1: RuntimeError: only rank 1 fails here")


def test_a_cancelled_notebook_keeps_its_completed_cells_and_marks_the_running_one(squashed_base, stack, root):
    path = notebook_file(
        root / "Long.ipynb",
        [
            "print('first done')",
            "import time\nprint('second started', flush=True)\ntime.sleep(300)",
            "print('never')",
        ],
    )
    job = Job.submit(notebook_spec(stack, squashed_base, path), root / "jobs")
    try:
        deadline = time.monotonic() + TIMEOUT
        while (job.output_notebook()["progress"] or {}).get("cell") != 2:
            assert time.monotonic() < deadline, (job.status(), job.logs("err"), job.batch_log())
            time.sleep(0.3)
        assert describe_progress(job.output_notebook()) == "rank 0 is in cell 2 of 3"
    finally:
        job.cancel()
    status = job.wait(timeout=120, poll_interval=0.3)
    assert status.state == "CANCELLED", status
    cells = executed(job).cells
    assert cells[0].outputs[0].text == "first done\n" and cells[0].metadata.podman_hpc.status == "ok"
    second = cells[1]
    assert second.outputs[0].text == "second started\n"
    assert second.metadata.podman_hpc.status == "stopped", json.dumps(second.metadata)
    assert second.outputs[-1].data["text/plain"].startswith("podman-hpc: the job was stopped (SIGTERM)")
    assert cells[2].outputs == [] and cells[2].execution_count is None
