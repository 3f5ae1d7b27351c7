"""Owner tokens, the orphan filter and the watchdog's wait (real processes, no podman)."""

import os
import socket
import subprocess
import sys
import threading
import time

from jupyter_podman_hpc.kernels import orphans
from jupyter_podman_hpc.kernels.orphans import HOST_LABEL, LABEL, OWNER_LABEL


def dead_pid():
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_owner_tokens_tell_live_from_dead_and_recycled_pids():
    token = orphans.owner_token()
    pid, start = token.split(":")
    assert int(pid) == os.getpid() and float(start) > 0
    assert orphans.owner_alive(token)
    assert not orphans.owner_alive(f"{dead_pid()}:1")
    assert not orphans.owner_alive(f"{os.getpid()}:{float(start) + 1:.2f}")  # same pid, another process
    assert not orphans.owner_alive("garbage")
    assert not orphans.owner_alive("")


def test_orphans_are_containers_of_dead_owners_on_this_host():
    host = socket.gethostname()
    containers = [
        {"Names": ["live"], "Labels": {LABEL: "a", OWNER_LABEL: orphans.owner_token(), HOST_LABEL: host}},
        {"Names": ["dead"], "Labels": {LABEL: "b", OWNER_LABEL: f"{dead_pid()}:5", HOST_LABEL: host}},
        {"Names": ["elsewhere"], "Labels": {LABEL: "c", OWNER_LABEL: f"{dead_pid()}:5", HOST_LABEL: "other-node"}},
        {"Names": ["unlabelled-owner"], "Labels": {LABEL: "d"}},
    ]
    assert [c["Names"][0] for c in orphans.orphans(containers, host)] == ["dead", "unlabelled-owner"]


def test_labels_name_kernel_owner_and_host():
    labels = orphans.labels("kid")
    assert labels == {LABEL: "kid", OWNER_LABEL: orphans.owner_token(), HOST_LABEL: socket.gethostname()}


def sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def wait_first_in_thread(owner, client):
    result = {}
    thread = threading.Thread(target=lambda: result.update(first=orphans.wait_first(owner, client)))
    thread.start()
    return thread, result


def test_watchdog_wakes_when_the_owner_dies_first():
    owner, client = sleeper(), sleeper()
    try:
        thread, result = wait_first_in_thread(orphans.owner_token(owner.pid), client.pid)
        time.sleep(0.3)
        assert thread.is_alive()  # nothing happened yet: it blocks
        started = time.monotonic()
        owner.kill()
        owner.wait()
        thread.join(5)
        assert result == {"first": "owner"} and time.monotonic() - started < 2
    finally:
        for process in (owner, client):
            process.kill()
            process.wait()


def test_watchdog_wakes_when_the_kernel_ends_first():
    owner, client = sleeper(), sleeper()
    try:
        thread, result = wait_first_in_thread(orphans.owner_token(owner.pid), client.pid)
        client.kill()
        client.wait()
        thread.join(5)
        assert result == {"first": "client"}
    finally:
        for process in (owner, client):
            process.kill()
            process.wait()


def test_an_owner_already_gone_counts_as_dead():
    client = sleeper()
    try:
        assert orphans.wait_first(f"{dead_pid()}:1", client.pid) == "owner"
    finally:
        client.kill()
        client.wait()


class HalfWayPodman:
    """A podman whose first ``rm`` calls leave the container (another remover holds it, or dies
    half-way): what the real podman does only under a job's SIGKILL, not on demand."""

    def __init__(self, failing: int):
        self.failing, self.calls = failing, []

    def remove_command(self, name):
        return ["rm", name]

    def run(self, argv, **kwargs):
        self.calls.append(argv)
        if argv[0] == "rm" and self.failing:
            self.failing -= 1
            raise subprocess.TimeoutExpired(argv, kwargs["timeout"])
        return subprocess.CompletedProcess(argv, 0)

    def __call__(self, *args, **kwargs):
        self.calls.append(list(args))
        return subprocess.CompletedProcess(args, 0 if self.failing else 1)  # exists: 0, gone: 1


def test_the_watchdog_removes_until_podman_says_the_container_is_gone(monkeypatch):
    monkeypatch.setattr(orphans.time, "sleep", lambda seconds: None)
    podman = HalfWayPodman(failing=2)
    assert orphans.remove_until_gone(podman, "k")
    assert podman.calls == [["rm", "k"], ["rm", "k"], ["rm", "k"], ["container", "exists", "k"]]
    assert not orphans.remove_until_gone(HalfWayPodman(failing=99), "k", tries=3)
