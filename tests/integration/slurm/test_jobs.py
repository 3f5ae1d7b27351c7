"""The Slurm job API on the 4-node cluster: JobSpec -> batch script -> sbatch -> status, logs,
cancel; notebooks and MPI at scale; jobs found again from a fresh process.

The squashed store of the session fixtures reaches the nodes through the spec's
``environment`` (exported by the batch script), not through the test's own
environment: the script alone carries what the job needs."""

import json
import os
import subprocess
import sys
import time

import nbformat
import pytest

from jupyter_podman_hpc.slurm import Job, JobSpec, JobTimeout, SlurmClient, SlurmError
from tests.helpers.commands import run
from tests.helpers.hpc import store_env

MPI_ENV = {"OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "lo", "OMPI_MCA_oob_tcp_if_include": "lo"}
TIMEOUT = 300  # seconds a job may take, queueing behind other jobs included (nodes are exclusive)


def submit_and_wait(spec, root, **kwargs):
    events = []
    job = Job.submit(spec, root)
    status = job.wait(timeout=TIMEOUT, poll_interval=0.5, progress=events.append, **kwargs)
    return job, status, events


@pytest.mark.parametrize("mode", ["podman-exec", "per-process"])
def test_a_job_of_4_nodes_by_2_tasks_runs_every_rank_inside_the_image(squashed_base, stack, root, mode):
    command = ["sh", "-c", 'echo "rank=$SLURM_PROCID node=$SLURMD_NODENAME $(grep VERSION_CODENAME /etc/os-release)"']
    spec = JobSpec(
        image=stack.base_image,
        command=command,
        nodes=4,
        tasks_per_node=2,
        time="10:00",
        partition=stack.partition,
        environment=store_env(squashed_base),
        mode=mode,
    )
    job, status, events = submit_and_wait(spec, root)
    assert status.state == "COMPLETED" and status.exit_code == 0, (status, job.batch_log(), job.logs("err"))
    assert status.nodes == stack.nodes
    logs = job.logs()
    assert sorted(logs) == list(range(8))
    nodes = {}
    for rank, text in logs.items():
        fields = dict(item.split("=", 1) for item in text.split())
        assert fields["rank"] == str(rank) and fields["VERSION_CODENAME"] == "bookworm"
        nodes.setdefault(fields["node"], []).append(rank)
    assert sorted(nodes) == list(stack.nodes) and all(len(r) == 2 for r in nodes.values())
    launcher = "podman-hpc shared-run" if mode == "podman-exec" else "podman-hpc run --rm"
    assert launcher in job.script and job.script == (job.directory / "job.sh").read_text()
    assert {e.stage for e in events} == {"job"} and events[-1].message.startswith(f"job {job.id} COMPLETED")
    assert squashed_base.leftovers() == {}


def test_the_script_runs_as_written_with_sbatch_from_a_terminal(squashed_tiny, stack, root):
    spec = JobSpec(
        image=stack.tiny_image,
        command=["sh", "-c", "echo by-hand-$SLURM_PROCID"],
        nodes=2,
        tasks_per_node=1,
        environment=store_env(squashed_tiny),
    )
    job, status, _ = submit_and_wait(spec, root)
    assert status.state == "COMPLETED"
    for rank in (0, 1):
        (job.directory / f"rank-{rank}.out").unlink()
    # A login shell with a bare PATH (no virtual environment): sbatch and the script alone.
    terminal_env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ["HOME"],
        "USER": stack.user,
        "SLURM_CONF": str(stack.slurm_conf),
    }
    run(["sbatch", "--wait", str(job.directory / "job.sh")], env=terminal_env, cwd="/", timeout=TIMEOUT)
    assert job.logs() == {0: "by-hand-0\n", 1: "by-hand-1\n"}


def test_a_failing_rank_fails_the_job_with_its_exit_code(squashed_tiny, stack, root):
    command = ["sh", "-c", 'if [ "$SLURM_PROCID" = 5 ]; then echo failing >&2; exit 3; fi; echo fine']
    spec = JobSpec(
        image=stack.tiny_image, command=command, nodes=4, tasks_per_node=2, environment=store_env(squashed_tiny)
    )
    job, status, _ = submit_and_wait(spec, root)
    assert (status.state, status.exit_code) == ("FAILED", 3), status
    assert status.describe().startswith(f"job {job.id} FAILED (exit code 3) on n[1-4]")
    assert job.logs("err")[5] == "failing\n" and job.logs()[0] == "fine\n"
    assert "task 5: Exited with exit code 3" in job.batch_log()
    # Read again from the record, as after a restart, without asking Slurm.
    again = Job.find(job.id, root, client=SlurmClient(commands={"squeue": "false", "sacct": "false"}))
    assert (again.status().state, again.status().exit_code, again.status().source) == ("FAILED", 3, "record")


def test_cancel_stops_the_job_and_leaves_nothing_on_any_node(squashed_tiny, stack, root):
    hpc = squashed_tiny
    spec = JobSpec(
        image=stack.tiny_image,
        command=["sh", "-c", "echo started; exec sleep 300"],
        nodes=4,
        tasks_per_node=2,
        environment=store_env(hpc),
    )
    job = Job.submit(spec, root)
    try:
        with pytest.raises(JobTimeout, match=f"job {job.id} is still (PENDING|RUNNING) after 1 s"):
            job.wait(timeout=1)
        deadline = time.monotonic() + TIMEOUT
        while sum(text == "started\n" for text in job.logs().values()) < 8:
            assert time.monotonic() < deadline, f"the ranks did not all start: {job.logs()} {job.logs('err')}"
            time.sleep(0.2)
        assert job.status().state == "RUNNING"
    finally:
        cancelled = time.monotonic()
        job.cancel()
    status = job.wait(timeout=60, poll_interval=0.2)
    assert status.state == "CANCELLED", status
    assert time.monotonic() - cancelled < 30
    job.cancel()  # again, on a finished job: not an error
    # Once the nodes are free again (the checks are a job of their own): nothing remains.
    remaining = hpc.leftovers()
    assert remaining == {}, remaining
    assert time.monotonic() - cancelled < 60


def write_notebook(path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_markdown_cell("# Every rank runs this notebook"),
        nbformat.v4.new_code_cell(
            "import os\nrank = int(os.environ['SLURM_PROCID'])\nsize = int(os.environ['SLURM_NTASKS'])"
        ),
        nbformat.v4.new_code_cell("%time squares = sum(i * i for i in range(rank + 1))"),
        nbformat.v4.new_code_cell("!echo shell-{rank}"),
        nbformat.v4.new_code_cell("print(f'notebook rank {rank} of {size}: {squares}')"),
    ]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, str(path))
    return path


def test_a_notebook_at_scale_gives_each_rank_s_output(squashed_base, stack, root):
    notebook = write_notebook(root / "Analysis.ipynb")
    spec = JobSpec(
        image=stack.base_image, notebook=str(notebook), nodes=4, tasks_per_node=2, environment=store_env(squashed_base)
    )
    job, status, _ = submit_and_wait(spec, root / "jobs")
    assert status.state == "COMPLETED", (status, job.logs("err"), job.batch_log())
    assert {"Analysis.ipynb", "nbrunner.py", "out", "job.sh", "job.json"} <= {p.name for p in job.directory.iterdir()}
    assert (job.directory / "out" / "Analysis.out.ipynb").is_file()
    logs = job.logs()
    assert sorted(logs) == list(range(8))
    for rank, text in logs.items():
        squares = sum(i * i for i in range(rank + 1))
        assert f"notebook rank {rank} of 8: {squares}\n" in text, text
        assert f"shell-{rank}\n" in text and "Wall time" in text  # the magics ran, under IPython


@pytest.mark.parametrize("mode", ["podman-exec", "per-process"])
def test_mpi_allreduce_over_4_nodes_by_2_ranks(squashed_base, stack, root, mode):
    program = root / "allreduce.py"
    program.write_text(
        "from mpi4py import MPI\n"
        "comm = MPI.COMM_WORLD\n"
        "total = comm.allreduce(comm.Get_rank() + 1, op=MPI.SUM)\n"
        "print(f'rank {comm.Get_rank()} of {comm.Get_size()}: sum {total}')\n"
    )
    spec = JobSpec(
        image=stack.base_image,
        python_script=str(program),
        nodes=4,
        tasks_per_node=2,
        modules=["openmpi-pmix"],
        environment={**store_env(squashed_base), **MPI_ENV},
        mode=mode,
    )
    job, status, _ = submit_and_wait(spec, root / "jobs")
    assert "srun --mpi=pmix" in job.script
    assert status.state == "COMPLETED", (status, job.logs("err"), job.batch_log())
    assert job.logs() == {rank: f"rank {rank} of 8: sum 36\n" for rank in range(8)}


def test_jobs_are_found_again_from_a_fresh_process(squashed_tiny, stack, root):
    specs = [
        JobSpec(
            image=stack.tiny_image,
            command=["echo", word],
            nodes=1,
            environment=store_env(squashed_tiny),
            job_name=f"find-{word}",
        )
        for word in ("first", "second")
    ]
    jobs = [Job.submit(spec, root) for spec in specs]
    program = (
        "import json, sys\n"
        "from jupyter_podman_hpc.slurm import Job\n"
        "root = sys.argv[1]\n"
        "found = Job.find(sys.argv[2], root)\n"
        "found.wait(timeout=300)\n"
        "listed = Job.list(root)\n"
        "print(json.dumps({'found': [found.id, str(found.directory), found.logs()],\n"
        "                  'listed': [[j.id, j.spec.job_name, j.status().state] for j in listed]}))\n"
    )
    result = run([sys.executable, "-c", program, str(root), jobs[1].id], timeout=TIMEOUT + 60)
    seen = json.loads(result.stdout)
    assert seen["found"] == [jobs[1].id, str(jobs[1].directory), {"0": "second\n"}]
    states = {job_id: state for job_id, _, state in seen["listed"]}
    assert [name for _, name, _ in seen["listed"]] == ["find-first", "find-second"]
    assert states[jobs[1].id] == "COMPLETED" and states[jobs[0].id] in ("PENDING", "RUNNING", "COMPLETED")
    assert jobs[0].wait(timeout=TIMEOUT).state == "COMPLETED"


def test_slurm_s_refusals_are_errors_with_its_message_and_leave_no_directory(stack, root, squashed_tiny):
    spec = JobSpec(
        image=stack.tiny_image, command=["true"], partition="no-such-partition", environment=store_env(squashed_tiny)
    )
    with pytest.raises(SlurmError, match=r"(?i)invalid partition"):
        Job.submit(spec, root)
    assert list(root.iterdir()) == []
    with pytest.raises(SlurmError, match="Slurm has no record of job 99999999"):
        SlurmClient().status("99999999")
    with pytest.raises(SlurmError, match="Invalid job id specified"):
        SlurmClient().cancel("99999999")


def test_partitions_for_the_ui(stack):
    partitions = {p.name: p for p in SlurmClient().partitions()}
    debug = partitions[stack.partition]
    assert debug.default and debug.available == "up" and debug.nodes == len(stack.nodes)
    assert debug.time_limit == "infinite" and debug.time_limit_seconds is None
    assert debug.idle + debug.allocated + debug.other == debug.nodes


def test_the_batch_script_is_what_sbatch_accepts_for_every_option(stack, root):
    """sbatch --test-only checks the script's directives without running anything."""
    spec = JobSpec(
        image=stack.tiny_image,
        command=["true"],
        nodes=2,
        tasks_per_node=4,
        cpus_per_task=2,
        time="1-00:00:00",
        partition=stack.partition,
        job_name="test-only",
        extra_directives=[
            "--mem=100M",
            "--comment=ok",
            "--mail-type=END,FAIL",
            "--signal=B:USR1@60",
            "--exclusive",
            "--requeue",
            "--nice=10",
        ],
    )
    script = root / "job.sh"
    script.write_text(Job.preview(spec, root))
    result = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "to start at" in result.stderr, result.stderr


def test_cancel_in_per_process_mode_leaves_nothing_either(squashed_tiny, stack, root):
    hpc = squashed_tiny
    spec = JobSpec(
        image=stack.tiny_image,
        command=["sh", "-c", "echo started; exec sleep 120"],
        nodes=4,
        tasks_per_node=2,
        environment=store_env(hpc),
        mode="per-process",
    )
    job = Job.submit(spec, root)
    try:
        deadline = time.monotonic() + TIMEOUT
        while sum(text == "started\n" for text in job.logs().values()) < 8:
            assert time.monotonic() < deadline, f"the ranks did not all start: {job.logs('err')}"
            time.sleep(0.2)
    finally:
        job.cancel()
    assert job.wait(timeout=60, poll_interval=0.2).state == "CANCELLED"
    try:
        # Each rank's reaper removes its container after Slurm has killed the step (KillWait=5 s).
        assert hpc.leftovers(within=30) == {}
    finally:  # whatever the launcher left, for the tests that follow
        hpc.on_each_node("podman-hpc", "rm", "--all", "--force", "--time", "0", check=False)
