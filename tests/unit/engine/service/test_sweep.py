"""The sweep of private Podman services whose caller died: real processes stand in for the
service (a process named after its socket, with a child) and its caller; podman's part (the
build containers) is left to tests/faults/jupyter/test_server_restart.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from jupyter_podman_hpc.engine.base import processes
from jupyter_podman_hpc.engine.base.files import atomic_write
from jupyter_podman_hpc.engine.service import sweep as servicesweep
from jupyter_podman_hpc.engine.site.config import load_config

# a "service": its command line names its socket, and it has a child in a session of its own
SERVICE = (
    "import subprocess, sys, time; subprocess.Popen(['sleep', '300'], start_new_session=True); "
    "print(flush=True); time.sleep(300)"
)


@pytest.fixture
def config(tmp_path):
    return load_config(
        {
            "PODMANHPC_RUN_ROOT": str(tmp_path / "run"),
            "PODMANHPC_GRAPH_ROOT": str(tmp_path / "graph"),
            "SQUASH_DIR": str(tmp_path / "squash"),
        }
    )


@pytest.fixture
def spawned():
    started: list[subprocess.Popen] = []

    def spawn(*argv, **kwargs) -> subprocess.Popen:
        started.append(subprocess.Popen(argv, **kwargs))
        return started[-1]

    yield spawn
    for process in started:
        for pid in processes.descendants(process.pid):
            os.kill(pid, 9)
        process.kill()
        process.wait()


@pytest.fixture
def no_podman(monkeypatch):
    calls = []
    monkeypatch.setattr(servicesweep, "_remove_build_containers", lambda *args: calls.append(args) or [])
    return calls


def service(spawned, config, caller: str, tag: str):
    run_root = config.run_root
    os.makedirs(run_root, mode=0o700, exist_ok=True)
    sock = f"{run_root}/podman-hpc-op-{tag}.sock"
    process = spawned(sys.executable, "-c", SERVICE, f"unix://{sock}", stdout=subprocess.PIPE)
    process.stdout.readline()  # its child is started
    child = processes.descendants(process.pid)[0]
    for name in (".sock", ".log"):
        open(f"{run_root}/podman-hpc-op-{tag}{name}", "w").close()
    owner = f"{run_root}/podman-hpc-op-{tag}.owner"
    atomic_write(
        owner,
        json.dumps(
            {"caller": caller, "service": processes.owner_token(process.pid), "socket": sock, "started": time.time()}
        ),
        0o600,
    )
    return process, child, owner


def dead_token(spawned) -> str:
    process = spawned("sleep", "30")
    token = processes.owner_token(process.pid)
    process.kill()
    process.wait()
    return token


def test_the_service_of_a_dead_caller_is_killed_with_its_children_and_its_files_removed(config, spawned, no_podman):
    process, child, _owner = service(spawned, config, dead_token(spawned), "1-aaaaaa")
    lines = servicesweep.sweep(config)
    assert lines[0].startswith("stopped the Podman service podman-hpc-op-1-aaaaaa.sock of a process that died")
    process.wait(timeout=10)
    assert not processes.running(child)
    assert os.listdir(config.run_root) == []
    assert len(no_podman) == 1  # and then its build containers are looked for


def test_the_service_of_a_live_caller_is_left_alone_and_stops_the_removal_of_build_containers(
    config, spawned, no_podman
):
    live, child, _owner = service(spawned, config, processes.owner_token(), "2-bbbbbb")
    dead, _, _ = service(spawned, config, dead_token(spawned), "3-cccccc")
    servicesweep.sweep(config)
    dead.wait(timeout=10)
    assert live.poll() is None and processes.running(child)
    assert sorted(os.listdir(config.run_root)) == [f"podman-hpc-op-2-bbbbbb{s}" for s in (".log", ".owner", ".sock")]
    assert no_podman == []  # a live build may own them


@pytest.mark.parametrize("spoil", ["others-writable", "foreign-socket", "pid-reused"])
def test_a_record_that_cannot_be_trusted_kills_nothing(config, spawned, no_podman, tmp_path, spoil):
    process, child, owner = service(spawned, config, dead_token(spawned), "4-dddddd")
    data = json.loads(open(owner).read())
    if spoil == "others-writable":
        os.chmod(owner, 0o646)
    elif spoil == "foreign-socket":  # a record may only name a socket beside it
        atomic_write(owner, json.dumps({**data, "socket": str(tmp_path / "podman-hpc-op-x.sock")}), 0o600)
    else:  # the service's pid is now another process: its start time differs
        pid = data["service"].partition(":")[0]
        atomic_write(owner, json.dumps({**data, "service": f"{pid}:12.00"}), 0o600)
    servicesweep.sweep(config)
    assert process.poll() is None and processes.running(child)
