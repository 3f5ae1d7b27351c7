"""Job records against other users: a job's directory, record and script are its owner's alone.

``job.json`` and ``job.sh`` hold the job's environment, often tokens. Before, they were
written under the umask: job directories 0755, records 0644, so anyone on the machine who
could reach the jobs root (a scratch directory left 0755, as the stack's is) read them.
The victim (hpcuser) submits a real job whose environment carries a token; the outsider
(hpcoutsider) and a fellow project member (hpcuser2) try to read its record, script, outputs and
directory listing; the owner still lists the job and reads everything.
"""

import secrets
import shutil
import stat

import pytest

from jupyter_podman_hpc.slurm import Job, JobSpec

STORE_VARS = (
    "SQUASH_DIR",
    "PODMANHPC_GRAPH_ROOT",
    "PODMANHPC_RUN_ROOT",
    "PODMANHPC_CONFIG_HOME",
    "PODMANHPC_SQUASH_UNPACK_DIR",
)


@pytest.fixture
def root(stack):
    """A jobs root on the shared scratch that others may enter, as many users' are."""
    path = stack.work_dir("jobs")
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_other_users_cannot_read_a_job_record(squashed_tiny, stack, root, outsider, member):
    token = f"s3cret-{secrets.token_hex(8)}"
    environment = {name: squashed_tiny.env[name] for name in STORE_VARS}
    spec = JobSpec(
        image=stack.tiny_image,
        command=["sh", "-c", "echo rank-$SLURM_PROCID-ran"],
        nodes=1,
        tasks_per_node=1,
        time="5:00",
        partition=stack.partition,
        environment={**environment, "JPH_TOKEN": token},
    )
    job = Job.submit(spec, root)
    status = job.wait(timeout=300, poll_interval=0.5)
    assert status.state == "COMPLETED", (status, job.batch_log())
    record = job.directory / "job.json"
    assert token in record.read_text() and token in job.script

    for other in (outsider, member):
        for argv in (
            ["cat", str(record)],
            ["cat", str(job.directory / "job.sh")],
            ["cat", str(job.directory / "rank-0.out")],
            ["ls", str(job.directory)],
        ):
            attempt = other.sh(*argv, check=False)
            assert attempt.returncode != 0 and "Permission denied" in attempt.stderr, (other.user, argv, attempt)
            assert token not in attempt.stdout
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (job.directory, record, job.directory / "job.sh")}
    assert modes == {job.directory.name: 0o700, "job.json": 0o600, "job.sh": 0o700}

    # the owner: the job is listed from disk and Slurm, and every file of it reads
    again = Job.find(job.id, root)
    assert again.directory == job.directory and again.record.spec["environment"]["JPH_TOKEN"] == token
    assert again.status().state == "COMPLETED"
    assert again.logs() == {0: "rank-0-ran\n"}
