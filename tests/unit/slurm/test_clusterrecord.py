"""An interactive cluster's record and files against its engines (an untrusted image that writes in its job
directory): the host acts on its own record, signals only the cluster's own processes, reads the controller's
log as data, and puts the engines' connection file where they work through no link."""

import json
import os
import subprocess
import sys
import time

import pytest

from jupyter_podman_hpc.engine.base.processes import owner_token
from jupyter_podman_hpc.slurm import cluster
from jupyter_podman_hpc.slurm.clusterrecord import (
    ClusterError,
    ClusterRecord,
    cluster_directories,
    connection_files,
    host_record,
    publish_engine_file,
    remove_connection_files,
)
from jupyter_podman_hpc.slurm.watchdog import MODULE, _controller_log, runs_part


@pytest.fixture
def directory(tmp_path):
    """A job directory in a jobs root, its ranks writing only ``out/``."""
    path = tmp_path / "jobs" / "20261204-172500-abcdef"
    (path / "out").mkdir(parents=True)
    return path


def record() -> ClusterRecord:
    return ClusterRecord("ab12cd34", "42", 2, owner="10:20", host="vm", watchdog="11:21", controller="12:22")


def test_the_host_acts_on_its_own_record_not_the_job_directorys_copy(directory):
    record().write(directory)
    copy = directory / "cluster.json"
    forged = {**json.loads(copy.read_text()), "controller": "1:1", "watchdog": "1:1", "job_id": "7"}
    copy.write_text(json.dumps(forged))
    read = ClusterRecord.read(directory)
    assert (read.controller, read.watchdog, read.job_id) == ("12:22", "11:21", "42")
    assert host_record(directory) == directory.parent / ".clusters" / f"{directory.name}.json"
    assert oct(host_record(directory).stat().st_mode & 0o777) == "0o600"


def test_an_earlier_versions_record_is_listed_but_gives_no_job_to_cancel(directory):
    (directory / "cluster.json").write_text(json.dumps({**record().__dict__}))
    os.chmod(directory / "cluster.json", 0o600)
    read = ClusterRecord.read(directory)
    assert (read.cluster_id, read.controller, read.job_id) == ("ab12cd34", "12:22", "")
    assert cluster_directories(directory.parent) == [directory]


@pytest.mark.parametrize(
    "change",
    [
        {"cluster_id": "../../x"},
        {"job_id": "42; rm"},
        {"controller": "self"},
        {"engines": "2"},
        {"state": "mine"},
        {"host": "a/b"},
    ],
)
def test_a_record_with_a_field_out_of_shape_is_refused_in_one_line(directory, change):
    record().write(directory)
    path = host_record(directory)
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(ClusterError, match=f"^{path} is not a cluster record: bad ") as raised:
        ClusterRecord.read(directory)
    assert len(str(raised.value).splitlines()) == 1


def test_a_record_that_is_a_link_is_not_read(directory, tmp_path):
    elsewhere = tmp_path / "elsewhere.json"
    record().write(directory)
    os.replace(host_record(directory), elsewhere)
    host_record(directory).symlink_to(elsewhere)
    with pytest.raises(ClusterError, match="is not a cluster record"):
        ClusterRecord.read(directory)


def sleeper(*argv: str, session: bool = True) -> subprocess.Popen:
    """A process whose command line carries ``argv`` (after a script that sleeps)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *argv], start_new_session=session)


def wait_started(process: subprocess.Popen) -> str:
    """Its owner token, once it runs its own command line (not the forked test's)."""
    deadline = time.monotonic() + 30
    while b"time.sleep(60)" not in open(f"/proc/{process.pid}/cmdline", "rb").read():
        assert time.monotonic() < deadline, "the process did not start"
        time.sleep(0.01)
    return owner_token(process.pid)


def test_only_the_clusters_own_controller_and_watchdog_are_recognised(directory, tmp_path):
    other = tmp_path / "jobs" / "other"
    other.mkdir()
    processes = {
        "controller": sleeper("-m", "ipyparallel.controller", f"--profile-dir={directory}/ipython"),
        "watchdog": sleeper("-m", MODULE, "--owner", "1:1", "--dir", str(directory)),
        "other's controller": sleeper("-m", "ipyparallel.controller", f"--profile-dir={other}/ipython"),
        "in our group": sleeper("-m", "ipyparallel.controller", f"--profile-dir={directory}/ipython", session=False),
        "a sleep": sleeper(),
    }
    try:
        tokens = {name: wait_started(process) for name, process in processes.items()}
        assert runs_part(tokens["controller"], directory, "controller")
        assert runs_part(tokens["watchdog"], directory, "watchdog")
        assert not runs_part(tokens["controller"], directory, "watchdog")
        assert not runs_part(tokens["watchdog"], directory, "controller")
        assert not runs_part(tokens["other's controller"], directory, "controller")
        assert not runs_part(tokens["in our group"], directory, "controller")  # not a group of its own
        assert not runs_part(tokens["a sleep"], directory, "controller")
        assert not runs_part(tokens["a sleep"], directory, "watchdog")
        pid = tokens["controller"].partition(":")[0]
        assert not runs_part(f"{pid}:1", directory, "controller")  # another start: another process
        assert not runs_part("", directory, "controller")
    finally:
        for process in processes.values():
            process.kill()
            process.wait()


def controller_files(directory):
    files = connection_files(directory, "ab12cd34")
    files["engine"].parent.mkdir(parents=True)
    for kind, path in files.items():
        path.write_text(json.dumps({"kind": kind}))
    return files


def test_the_engines_connection_file_is_copied_where_they_work_and_removed_with_the_others(directory):
    files = controller_files(directory)
    publish_engine_file(directory, "ab12cd34")
    copy = directory / "out" / "ipython" / "security" / files["engine"].name
    assert json.loads(copy.read_text()) == {"kind": "engine"}
    assert not (directory / "out" / "ipython" / "security" / files["client"].name).exists()
    remove_connection_files(directory, "ab12cd34")
    assert not copy.exists() and not any(path.exists() for path in files.values())


def test_an_earlier_versions_layout_has_the_engines_read_the_controllers_file(directory):
    (directory / "out").rmdir()
    controller_files(directory)
    publish_engine_file(directory, "ab12cd34")
    assert not (directory / "out").exists()


def test_a_half_written_engine_file_is_not_copied_yet(directory):
    files = controller_files(directory)
    files["engine"].write_text('{"kind": ')
    with pytest.raises(ValueError):
        publish_engine_file(directory, "ab12cd34")
    assert not (directory / "out" / "ipython").exists()


def test_a_link_the_engines_planted_is_not_written_through(directory, tmp_path):
    controller_files(directory)
    target = tmp_path / "target"
    target.mkdir()
    (directory / "out" / "ipython").symlink_to(target)
    with pytest.raises(OSError):
        publish_engine_file(directory, "ab12cd34")
    assert list(target.iterdir()) == []
    remove_connection_files(directory, "ab12cd34")
    assert list(target.iterdir()) == []


def test_a_controller_log_the_engines_replaced_is_read_as_data(directory):
    log = directory / "controller.log"
    log.symlink_to("/dev/zero")
    assert cluster._raised(log) == "" and cluster._tail(log) == "controller.log is a symbolic link: not read"
    with pytest.raises(ClusterError, match=r"controller\.log is not a regular file: the controller was not started"):
        _controller_log(directory)
    log.unlink()
    os.mkfifo(log)
    assert cluster._tail(log) == "controller.log is not a regular file: not read"  # at once: nothing writes
    with pytest.raises(ClusterError, match=r"controller\.log is not a regular file: the controller was not started"):
        _controller_log(directory)
    log.unlink()
    log.write_text("Traceback (most recent call last):\n  x\nValueError: big\n" + "noise\n" * 100_000)
    assert cluster._tail(log) == "noise"
    with _controller_log(directory) as appended:
        appended.write(b"more\n")
    assert cluster._tail(log) == "more"
