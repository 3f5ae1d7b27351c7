"""The warm pool's bookkeeping with stand-in containers (sleep processes): what it serves,
refilling after an adoption, giving up on a broken image, closing with its kernelspec; and
what a kernel start hands a pooled container (its key, its request, on its stdin).
The pool with real containers: tests/integration/kernels/test_pool.py."""

from __future__ import annotations

import collections
import json
import logging
import os
import subprocess
import sys
import threading
import time

import pytest

from jupyter_podman_hpc.engine.podman import Podman
from jupyter_podman_hpc.engine.site.config import load_config
from jupyter_podman_hpc.kernels import pool as pools
from jupyter_podman_hpc.kernels.container import KernelContainer


class Site:
    """Stand-in containers: ``spawn`` starts a process, ``remove`` kills it."""

    def __init__(self, exit_at_once: bool = False):
        self.exit_at_once = exit_at_once
        self.processes: dict[str, subprocess.Popen] = {}
        self.removed: list[str] = []
        self.stamp = b"spec"

    def spawn(self) -> pools.Pooled:
        name = f"c{len(self.processes)}"
        argv = ["true"] if self.exit_at_once else ["sleep", "60"]
        process = subprocess.Popen(argv, stdin=subprocess.PIPE)
        self.processes[name] = process
        ready = threading.Event()
        if not self.exit_at_once:
            ready.set()
        return pools.Pooled(
            name,
            process,
            collections.deque(),
            threading.Thread(target=lambda: None),
            ready,
            ("/home/u", "/srv/notebooks"),
        )

    def remove(self, names) -> None:
        for name in names:
            self.removed.append(name)
            self.processes[name].kill()

    def make(self, size: int) -> pools.Pool:
        return pools.Pool("spec:1", size, self.spawn, self.remove, lambda: self.stamp)

    def cleanup(self) -> None:
        for process in self.processes.values():
            process.kill()
            process.wait()


@pytest.fixture
def site(monkeypatch):
    monkeypatch.setattr(pools, "CHECK_SECONDS", 0.05)
    monkeypatch.setattr(pools, "HOLD_SECONDS", 0.3)
    instance = Site()
    yield instance
    instance.cleanup()


def wait(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_serves_kernels_under_its_directories_and_refills(site):
    pool = site.make(2)
    assert pool.wait_ready(5)
    assert pool.take("/elsewhere") is None  # not mounted in the pooled containers
    taken = pool.take("/srv/notebooks/project")
    assert taken is not None and taken.name in site.processes
    assert taken.name not in pool.names()
    pool.refill()  # the kernel is up: a replacement starts
    wait(lambda: len(pool.names()) == 2)
    assert taken.name not in site.removed  # it belongs to its kernel now
    pool.close()
    assert sorted(site.removed) == sorted(name for name in site.processes if name != taken.name)


def test_a_pool_closes_when_its_kernelspec_changes(site):
    pool = site.make(1)
    assert pool.wait_ready(5)
    [name] = pool.names()
    site.stamp = None  # removed
    wait(lambda: pool.closed)
    assert site.removed == [name] and pool.take("/home/u") is None


def test_containers_that_die_before_ready_stop_the_refills(monkeypatch):
    monkeypatch.setattr(pools, "CHECK_SECONDS", 0.02)
    site = Site(exit_at_once=True)
    try:
        pool = site.make(1)
        wait(lambda: len(site.processes) >= pools.MAX_FAILURES)
        time.sleep(0.3)
        assert len(site.processes) == pools.MAX_FAILURES  # it gave up: kernels start on demand
        assert not pool.wait_ready(0.1)
        pool.close()
    finally:
        site.cleanup()


def test_the_registry_makes_one_pool_per_key_and_closes_all(site):
    made = []

    def make():
        made.append(site.make(1))
        return made[-1]

    first = pools.get("spec:1", make)
    assert pools.get("spec:1", make) is first and len(made) == 1
    assert pools.find("spec:1") is first
    pools.close_all()
    assert first.closed and pools.find("spec:1") is None


def test_a_kernelspec_pool_key_changes_with_its_kernel_json(tmp_path):
    spec_file = tmp_path / "python-base" / "kernel.json"
    assert pools.spec_key(spec_file) is None  # no kernelspec: no pool
    spec_file.parent.mkdir()
    spec_file.write_text('{"argv": []}')
    first = pools.spec_key(spec_file)
    assert first is not None and first.startswith("python-base:")
    spec_file.write_text('{"argv": ["python3"]}')
    assert pools.spec_key(spec_file) not in (None, first)


def container(tmp_path, monkeypatch) -> KernelContainer:
    monkeypatch.setenv("PODMANHPC_GRAPH_ROOT", str(tmp_path / "graph"))
    monkeypatch.setenv("PODMANHPC_RUN_ROOT", str(tmp_path / "run"))
    monkeypatch.setenv("PODMANHPC_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("HOME", str(tmp_path))
    podman = Podman(load_config(os.environ), os.environ)
    return KernelContainer(
        podman,
        "localhost/base:1",
        [],
        spec_argv=["python3", "-m", "ipykernel_launcher"],
        spec_env={"MY_VAR": "1"},
        pass_env=["JPY_*"],
    )


def test_the_adoption_request_carries_the_connection_the_cwd_and_the_passed_environment(tmp_path, monkeypatch):
    kernel = container(tmp_path, monkeypatch)
    connection_file = tmp_path / "kernel-abc.json"
    connection_file.write_text(json.dumps({"shell_port": 5}))
    cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", str(connection_file)]
    env = {"MY_VAR": "value", "JPY_SESSION_NAME": "nb", "SECRET": "x", "JPY_PARENT_PID": "7"}
    request = pools.adoption_request(kernel, "", cmd, env, str(tmp_path), logging.getLogger("test"))
    assert request == {
        "connection_file": str(connection_file),
        "connection_info": {"shell_port": 5},
        "cwd": str(tmp_path),
        "env": {"HOME": str(tmp_path), "JPY_SESSION_NAME": "nb", "MY_VAR": "value"},
        "argv": ["-f", str(connection_file)],
    }


def test_an_unreadable_connection_file_means_no_adoption(tmp_path, monkeypatch, caplog):
    kernel = container(tmp_path, monkeypatch)
    missing = str(tmp_path / "gone.json")
    cmd = ["python3", "-m", "ipykernel_launcher", "-f", missing]
    assert pools.adoption_request(kernel, "", cmd, {}, None, logging.getLogger("test")) is None
    assert f"cannot read the connection file {missing}" in caplog.text


def test_a_pooled_container_reads_its_request_on_its_stdin():
    process = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    entry = pools.Pooled(
        "c0", process, collections.deque(), threading.Thread(target=lambda: None), threading.Event(), ()
    )
    assert entry.hand_over({"argv": ["-f", "k.json"]})
    assert json.loads(process.stdout.read()) == {"argv": ["-f", "k.json"]}
    process.wait()
    assert not entry.hand_over({"argv": []})  # its stdin is closed: it cannot take another
