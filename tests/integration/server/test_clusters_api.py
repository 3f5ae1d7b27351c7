"""The clusters API: running interactive clusters listed with their engines, and stopped, by the server."""

import asyncio

from jupyter_podman_hpc.slurm.cluster import Cluster
from tests.helpers.commands import run

STORE_VARS = ("PODMANHPC_GRAPH_ROOT", "PODMANHPC_RUN_ROOT", "PODMANHPC_CONFIG_HOME", "SQUASH_DIR")


async def test_a_running_cluster_is_listed_with_its_engines_and_stopped_by_the_server(
    api, squashed_base, stack, job_root, monkeypatch
):
    for key in STORE_VARS:
        monkeypatch.setenv(key, squashed_base.env[key])
    cluster = await asyncio.to_thread(
        Cluster.start, stack.base_image, nodes=2, time="10", partition=stack.partition, root=job_root
    )
    try:
        status, body = await api("GET", "clusters")
        assert status == 200, body
        [found] = body["clusters"]
        assert (found["id"], found["job_id"], found["engines"], found["registered"]) == (
            cluster.id,
            cluster.job_id,
            2,
            2,
        ), found
        assert found["state"] == "running" and found["job_state"] == "RUNNING" and found["nodes"] == 2

        status, body = await api("DELETE", "clusters", cluster.id)
        assert status == 200 and body["state"] == "stopped" and body["registered"] == 0, body
        queued = run(["squeue", "-h", "-j", cluster.job_id, "-t", "PD,R,CG", "-o", "%i"]).stdout
        assert queued == "", queued
        assert not list((cluster.directory / "ipython" / "security").glob("*.json"))
        status, body = await api("GET", "clusters")
        assert status == 200 and body["clusters"] == [], body
    finally:
        await asyncio.to_thread(cluster.stop)

    status, body = await api("DELETE", "clusters", "deadbeef")
    assert status == 404 and body["message"] == "no cluster 'deadbeef'", body
