"""A job whose podman-exec step outlives its time limit (--time): Slurm ends it, no container is
left on any node, and the job shows TIMEOUT in the REST listing and in ``%podman_hpc jobs``."""

from __future__ import annotations

import pytest

from jupyter_podman_hpc.slurm import Job, JobSpec
from tests.faults.jupyter.conftest import STORE_VARS, jobs_server_config
from tests.integration.magics.conftest import start_session

pytestmark = [pytest.mark.faults, pytest.mark.integration]


@pytest.fixture
def jp_server_config(jp_root_dir, jobs_root):
    return jobs_server_config(jobs_root)


async def test_a_step_past_its_time_limit_ends_timeout_with_no_container_left(api, hpc, stack, jobs_root, tmp_path):
    hpc("pull", stack.tiny_image)
    hpc.wipe_local_storage()
    spec = JobSpec(image=stack.tiny_image, command=["sleep", "600"], nodes=2, tasks_per_node=2, time="1",
                   mode="podman-exec", environment={key: hpc.env[key] for key in STORE_VARS},
                   job_name="faults-time-limit")
    job = Job.submit(spec, jobs_root)
    status = job.wait(timeout=300, poll_interval=2)  # the shortest limit Slurm takes is a minute
    assert status.state == "TIMEOUT", status
    assert hpc.leftovers() == {}  # every node's container, step directory and mount gone

    code, body = await api("GET", "jobs")
    assert code == 200 and [(j["id"], j["status"]["state"]) for j in body["jobs"]] == [(job.id, "TIMEOUT")]
    kernel = start_session(hpc, tmp_path / "kernel")
    try:
        cell = kernel.execute("%podman_hpc jobs")
        assert cell.ok, cell.show()
        header, row = cell.result["text/plain"].splitlines()
        assert row.split()[:3] == [job.id, "faults-time-limit", "TIMEOUT"], cell.result["text/plain"]
    finally:
        kernel.close()
