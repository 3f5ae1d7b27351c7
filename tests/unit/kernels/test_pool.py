"""The warm pool's bookkeeping with stand-in containers (sleep processes): what it serves,
refilling after an adoption, giving up on a broken image, closing with its kernelspec.
The pool with real containers: tests/integration/kernels/test_pool.py."""

from __future__ import annotations

import collections
import subprocess
import threading
import time

import pytest

from jupyter_podman_hpc.kernels import pool as pools


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
        return pools.Pooled(name, process, collections.deque(), threading.Thread(target=lambda: None), ready,
                            ("/home/u", "/srv/notebooks"))

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
    pool.adopted()  # the kernel is up: a replacement starts
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
