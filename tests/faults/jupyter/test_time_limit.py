"""A job whose podman-exec step outlives its time limit (--time), and an interactive cluster whose
job does, side by side (one minute is the shortest limit Slurm takes): Slurm ends both, no
container is left on any node, the jobs show TIMEOUT in the REST listing and in
``%podman_hpc jobs``, and the cluster's watchdog sees its job end and stops its controller: the
cluster is listed as ended (job TIMEOUT) by REST (the Lab's Clusters section) and by the magic."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from jupyter_podman_hpc.engine.base.processes import owner_alive
from jupyter_podman_hpc.slurm import Job, JobSpec
from jupyter_podman_hpc.slurm.clusterrecord import ClusterRecord
from jupyter_podman_hpc.slurm.watchdog import JOB_POLL
from tests.helpers.hpc import STORE_VARS
from tests.helpers.magics_kernel import start_session
from tests.helpers.server_extension import jobs_server_config

pytestmark = [pytest.mark.faults, pytest.mark.integration]


@pytest.fixture
def jp_server_config(jp_root_dir, jobs_root):
    return jobs_server_config(jobs_root)


async def ended_cluster(api, cluster_id: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        code, body = await api("GET", "clusters")
        assert code == 200, body
        [cluster] = [c for c in body["clusters"] if c["id"] == cluster_id]
        if cluster["state"] == "ended" or time.monotonic() > deadline:
            return cluster
        await asyncio.sleep(1)


async def test_a_step_and_a_cluster_past_their_time_limits_end_timeout_with_nothing_left(
    api, hpc, stack, squashed_base, jobs_root, tmp_path
):
    hpc("pull", stack.tiny_image)
    hpc.wipe_local_storage()
    # the cluster's kernel runs the base image from its squashed store, its jobs where the server looks
    kernel = start_session(squashed_base, tmp_path / "kernel", SCRATCH=str(hpc.work / "scratch"))
    try:
        cell = kernel.execute(
            f"cluster = %podman_hpc cluster start --nodes 2 --time 1 {stack.base_image}\n"
            "print(cluster.id, cluster.job_id, str(cluster.directory))"
        )
        assert cell.ok, cell.show()
        cluster_id, cluster_job, directory = cell.stdout.splitlines()[-1].split()
        spec = JobSpec(
            image=stack.tiny_image,
            command=["sleep", "600"],
            nodes=2,
            tasks_per_node=2,
            time="1",
            mode="podman-exec",
            environment={key: hpc.env[key] for key in STORE_VARS},
            job_name="faults-time-limit",
        )
        job = Job.submit(spec, jobs_root)
        status = job.wait(timeout=300, poll_interval=2)
        assert status.state == "TIMEOUT", status
        assert hpc.leftovers() == {}  # every node's container, step directory and mount gone

        cluster = await ended_cluster(api, cluster_id, timeout=JOB_POLL * 3 + 60)
        assert (cluster["state"], cluster["job_state"], cluster["registered"]) == ("ended", "TIMEOUT", 0), cluster
        record = ClusterRecord.read(Path(directory))
        assert not owner_alive(record.controller) and not owner_alive(record.watchdog), record
        assert squashed_base.leftovers() == {}

        code, body = await api("GET", "jobs")
        assert code == 200
        assert sorted((j["id"], j["status"]["state"]) for j in body["jobs"]) == sorted(
            [(job.id, "TIMEOUT"), (cluster_job, "TIMEOUT")]
        ), body["jobs"]
        cell = kernel.execute("%podman_hpc jobs")
        assert cell.ok, cell.show()
        rows = {row.split()[0]: row.split() for row in cell.result["text/plain"].splitlines()[1:]}
        assert set(rows) == {job.id, cluster_job}, cell.result["text/plain"]
        assert rows[job.id][1:3] == ["faults-time-limit", "TIMEOUT"] and "TIMEOUT" in rows[cluster_job], rows
        cell = kernel.execute("%podman_hpc cluster list")
        assert cell.ok and cell.stdout.startswith(f"{cluster_id}  job {cluster_job} TIMEOUT  0/2 engines"), cell.show()
        assert cell.stdout.rstrip().endswith("ended: stop it to clear it"), cell.show()
        cell = kernel.execute("%podman_hpc cluster stop")
        assert cell.ok, cell.show()
        cell = kernel.execute("%podman_hpc cluster list")
        assert cell.stdout == "No running clusters started by this kernel\n", cell.show()
    finally:
        kernel.close()
