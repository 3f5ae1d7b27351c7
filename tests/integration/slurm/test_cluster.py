"""Interactive clusters from the API (``slurm/cluster.py``) on the 4-node cluster: how a start fails.

The kernel-side flow (``%podman_hpc cluster``, ``%%px``, a killed kernel) is in
``tests/integration/magics/test_cluster.py``.
"""

import json
import socket

import pytest

from jupyter_podman_hpc.engine.base.processes import owner_alive
from jupyter_podman_hpc.slurm import SlurmClient, cluster
from jupyter_podman_hpc.slurm.cluster import Cluster, ClusterError
from tests.helpers.commands import run
from tests.helpers.hpc import store_env

pytestmark = pytest.mark.slow

TASK_SCHEDULER_PORTS = (3, 11)  # the task scheduler's engine and client ports, in ipyparallel 9's order of a block


def test_a_controller_whose_scheduler_cannot_listen_fails_the_start_in_one_line(
    squashed_base, stack, root, monkeypatch
):
    """What a port taken between ipyparallel's choice and its scheduler's bind did in a fresh-clone run:
    the task scheduler died, the controller served on without it and the start waited for engines until
    the notebook's timeout. The taken port is made here by holding it; the start now says why, at once,
    and leaves no job, controller or connection file."""
    block = cluster.controller_ports()
    monkeypatch.setattr(cluster, "controller_ports", lambda: block)
    holders = []
    try:
        for index in TASK_SCHEDULER_PORTS:
            holder = socket.socket()
            holders.append(holder)
            holder.bind(("127.0.0.1", block[index]))
            holder.listen()
        with pytest.raises(ClusterError) as raised:
            Cluster.start(
                stack.base_image,
                nodes=2,
                time="5",
                root=root,
                timeout=300,
                client=SlurmClient(env=squashed_base.env),
                environment=store_env(squashed_base),
            )
    finally:
        for holder in holders:
            holder.close()
    message = str(raised.value)
    assert message.startswith("the IPython Parallel controller failed (") and "Address already in use" in message
    assert len(message.splitlines()) == 1
    [record_path] = root.glob("*/cluster.json")
    record = json.loads(record_path.read_text())
    assert record["state"] == "stopped", record
    assert not owner_alive(record["controller"]) and not owner_alive(record["watchdog"]), record
    queued = run(["squeue", "-h", "-j", record["job_id"], "-o", "%i"], env=squashed_base.env).stdout
    assert record["job_id"] not in queued.split()
    assert not list((record_path.parent / "ipython" / "security").glob("*.json"))
    assert squashed_base.leftovers(within=30) == {}
