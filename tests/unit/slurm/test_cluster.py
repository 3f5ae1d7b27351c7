"""An interactive cluster's parts: the engines' job (a JobSpec like any submission's), the controller's ports,
what its log says when it failed."""

import socket
from pathlib import Path

import pytest

from jupyter_podman_hpc.slurm import cluster
from jupyter_podman_hpc.slurm.cluster import (
    CONTROLLER_PORTS,
    DEFAULT_TIME,
    PORTS_FLOOR,
    ClusterError,
    cluster_spec,
    controller_argv,
    controller_ports,
    engine_argv,
)
from jupyter_podman_hpc.slurm.spec import JobSpecError


def test_every_rank_runs_an_engine_reading_the_connection_file_of_its_cluster():
    spec = cluster_spec("ab12cd34", "reg/image:1", nodes=4, tasks_per_node=2, partition="debug")
    assert spec.command == engine_argv("ab12cd34")
    assert spec.command[:3] == ("python3", "-m", "ipyparallel.engine")
    assert "--file=ipython/security/ipcontroller-ab12cd34-engine.json" in spec.command
    assert "--mpi" not in spec.command
    assert (spec.ntasks, spec.mode, spec.workdir, spec.time) == (8, "podman-exec", None, DEFAULT_TIME)
    assert spec.default_job_name() == "ipengines-ab12cd34"


def test_an_mpi_module_makes_the_engines_mpi_ranks():
    spec = cluster_spec("x1", "reg/image:1", modules=("openmpi-pmix",), time="5", job_name="mine")
    assert spec.command[-1] == "--mpi" and spec.time == "5" and spec.job_name == "mine"


def test_the_submit_paths_validation_applies():
    with pytest.raises(JobSpecError, match="nodes must be between 1 and 100000, not 0"):
        cluster_spec("x1", "reg/image:1", nodes=0)
    with pytest.raises(JobSpecError, match="image"):
        cluster_spec("x1", "Not Valid")


@pytest.mark.parametrize("field", ["command", "notebook", "mode", "workdir"])
def test_what_runs_is_the_clusters_own(field):
    with pytest.raises(ClusterError, match=f"a cluster sets {field} itself"):
        cluster_spec("x1", "reg/image:1", **{field: "x"})


def test_an_unknown_field_is_one_line():
    with pytest.raises(ClusterError, match="not a job specification field"):
        cluster_spec("x1", "reg/image:1", colour="red")


def test_a_record_update_keeps_what_the_watchdog_wrote(tmp_path):
    from jupyter_podman_hpc.slurm.cluster import ClusterRecord

    directory = tmp_path / "job"
    directory.mkdir()
    mine = ClusterRecord("ab12cd34", "42", 8, owner="10:20", host="vm")
    mine.write(directory)
    theirs = ClusterRecord.read(directory)
    theirs.update(directory, watchdog="11:21", controller="12:22")
    mine.update(directory, state="running")
    again = ClusterRecord.read(directory)
    assert (again.state, again.watchdog, again.controller, again.engines) == ("running", "11:21", "12:22", 8)
    assert [p.name for p in directory.iterdir()] == ["cluster.json"]
    assert [p.name for p in (tmp_path / ".clusters").iterdir()] == ["job.json"]


def test_the_controllers_ports_are_a_free_block_below_the_ephemeral_range(monkeypatch):
    first_ephemeral = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    block = controller_ports()
    assert len(block) == CONTROLLER_PORTS and block[0] >= PORTS_FLOOR and block[-1] < first_ephemeral
    argv = controller_argv(Path("/jobs/1"), "ab12", "127.0.0.1", block)
    assert f"--IPController.ports={block[0]}-{block[-1]}" in argv


def test_a_block_with_a_port_in_use_is_passed_over(monkeypatch):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = holder.getsockname()[1]
        starts = iter([busy - 3, busy + 1])
        monkeypatch.setattr(cluster.random, "randrange", lambda *_: next(starts))
        block = controller_ports(count=4)
    assert block == range(busy + 1, busy + 5)


def test_the_exception_of_a_controllers_traceback_is_its_one_line(tmp_path):
    log = tmp_path / "controller.log"
    log.write_text(
        "2026-12-03 07:00:00.000 [IPController] WARNING | a note\n"
        "Process Process-3:\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3.11/multiprocessing/process.py", line 314, in _bootstrap\n'
        "    self.run()\n"
        "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:20011')\n"
        "a later line\n"
    )
    assert cluster._raised(log) == "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:20011')"
    log.write_text("2026-12-03 07:00:00.000 [IPController] WARNING | no traceback here\n")
    assert cluster._raised(log) == ""
    assert cluster._raised(tmp_path / "absent.log") == ""
