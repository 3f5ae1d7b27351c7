"""An interactive cluster's record against its own engines' image.

The engines (IPython Parallel, ranks of a Slurm job, in containers of an untrusted image) run with the
cluster's job directory as their working directory. ``cluster.json`` there named the controller and the
watchdog as PID:START tokens and the job id, and stopping the cluster (the server's Containers panel,
``find_cluster(...).stop()``; the sweep does the same) signalled those processes and cancelled that job.
Code in the image rewrote it to name another process of the user's (under ``--pid=host`` an image reads
every pid and start time) and another job of the user's: the stop then SIGTERMed that process and
cancelled that job, and left the cluster's own controller running.

Here the engine's code forges the record (where the job directory is read-only to the ranks, its write
is refused and the user stands in for an image that reached it another way): the stop signals nothing of
the user's, cancels only the cluster's own job, and still stops the cluster's controller and watchdog.
"""

import json
import signal
import subprocess
import textwrap
import time

import pytest

from jupyter_podman_hpc.engine.base.processes import owner_alive, owner_token
from jupyter_podman_hpc.slurm import SlurmClient
from jupyter_podman_hpc.slurm.cluster import Cluster, find_cluster
from jupyter_podman_hpc.slurm.clusterrecord import RECORD, ClusterRecord
from tests.helpers.commands import run
from tests.helpers.hpc import store_env

pytestmark = pytest.mark.slow

QUEUED = "PD,CF,R"


def in_queue(hpc, job_id: str) -> bool:
    result = run(["squeue", "-h", "-j", job_id, "-t", QUEUED, "-o", "%i"], env=hpc.env, check=False)
    return job_id in result.stdout.split()


def cancel_and_wait(client: SlurmClient, job_id: str) -> None:
    client.cancel(job_id)
    deadline = time.monotonic() + 60  # until it no longer holds its node (in_queue: completing included)
    while client.in_queue(job_id) and time.monotonic() < deadline:
        time.sleep(0.5)


def forge(view, forged: dict) -> str:
    """Code in the engine (the image) rewrites the cluster.json of its working directory; what happened."""
    view.execute(
        textwrap.dedent(f"""
        import json, os
        try:
            with open({RECORD!r}) as file:
                record = json.load(file)
            record.update({forged!r})
            with open(".forged.tmp", "w") as file:
                json.dump(record, file)
            os.replace(".forged.tmp", {RECORD!r})
            forged_here = "rewritten"
        except OSError as err:
            forged_here = f"refused: {{err}}"
        """),
        block=True,
    )
    return view.pull("forged_here", block=True)[0]


def test_a_record_an_engine_rewrote_makes_the_stop_signal_and_cancel_nothing_else(squashed_base, stack, root):
    client = SlurmClient(env=squashed_base.env)
    victim = subprocess.Popen(["sleep", "600"], start_new_session=True)  # a process group leader, as a server is
    other_job = run(
        ["sbatch", "--parsable", "-p", stack.partition, "-t", "5", "-o", "/dev/null", "--wrap", "sleep 600"],
        env=squashed_base.env,
    ).stdout.strip()
    cluster = None
    try:
        cluster = Cluster.start(
            stack.base_image,
            nodes=1,
            time="5",
            root=root,
            timeout=300,
            client=client,
            partition=stack.partition,
            environment=store_env(squashed_base),
        )
        genuine = ClusterRecord.read(cluster.directory)
        assert owner_alive(genuine.controller) and owner_alive(genuine.watchdog), genuine
        view = cluster.client()[:]
        assert view.apply_sync(int, 7) == [7]  # the engines work

        token = owner_token(victim.pid)
        forged = {"controller": token, "watchdog": token, "job_id": other_job}
        outcome = forge(view, forged)
        if outcome != "rewritten":  # the job directory is out of the engines' reach: the user stands in
            path = cluster.directory / RECORD
            path.write_text(json.dumps({**json.loads(path.read_text()), **forged}))

        found = find_cluster(cluster.id, root, client=client)  # as the server's Containers panel does
        found.stop(timeout=120)

        assert victim.poll() is None, f"the user's process was signalled ({victim.returncode}; engine: {outcome})"
        assert in_queue(squashed_base, other_job), f"the user's job {other_job} was cancelled"
        assert not in_queue(squashed_base, cluster.job_id), "the cluster's own job was not cancelled"
        assert not owner_alive(genuine.controller) and not owner_alive(genuine.watchdog), genuine
        assert not any(path.exists() for path in cluster.connection_files.values())
        assert ClusterRecord.read(cluster.directory).state == "stopped"
        # the partition gives whole nodes: the check's srun on every node waits for the user's job's end
        cancel_and_wait(client, other_job)
        assert squashed_base.leftovers(within=30) == {}
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        run(["scancel", other_job], env=squashed_base.env, check=False)
        if cluster is not None:
            cluster.stop(timeout=60)
