"""The per-user Podman API service on the real stack: started on demand, shared between
processes, replaced when stale, gone when idle, and seeing the squashed store."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jupyter_podman_hpc.engine.base import processes
from jupyter_podman_hpc.engine.service import rest as service
from jupyter_podman_hpc.engine.site.config import load_config

CALLER = """
import json, os, sys
from jupyter_podman_hpc.engine.service import rest as service
from jupyter_podman_hpc.engine.site.config import load_config
config = load_config()
svc = service.ApiService(config, idle=int(sys.argv[1]))
url = svc.ensure()
version = service.client(config, idle=int(sys.argv[1])).version()
print(json.dumps({"url": url, "pid": svc.pid(), "version": version["Version"],
                  "api": version.get("ApiVersion"), "me": os.getpid(), "sid": os.getsid(0)}))
"""


@pytest.fixture
def shared(hpc):
    """The shared service of the test's private storage, stopped afterwards."""
    config = load_config(hpc.env)
    yield config, service.ApiService(config, idle=60)
    service.ApiService(config).stop()


def service_processes(url: str) -> list[int]:
    """Outermost podman processes serving ``url`` (rootless podman re-executes itself once)."""
    table = processes.parents()
    serving = {pid for pid in table if url in processes.cmdline(pid)}
    return sorted(pid for pid in serving if table.get(pid) not in serving)


def wait_for(condition, timeout: float, step: float = 0.1) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(step)
    return time.monotonic() - start


def test_two_processes_starting_at_once_share_one_detached_service(hpc, shared):
    config, svc = shared
    callers = [
        subprocess.Popen(
            [sys.executable, "-c", CALLER, "60"], env=hpc.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    results = []
    for caller in callers:
        out, err = caller.communicate(timeout=120)
        assert caller.returncode == 0, err
        results.append(json.loads(out))
    first, second = results
    assert first["url"] == second["url"] == svc.url
    assert first["pid"] == second["pid"] and first["pid"] is not None
    assert first["version"] and first["api"]  # podman-py 5.x talks to the stack's podman 4.3.1
    assert service_processes(svc.url) == [first["pid"]]

    # Both callers are gone; the service lives on, in a session of its own, its
    # output in the log file, not in anybody's pipes.
    pid = first["pid"]
    assert svc.alive()
    assert os.getsid(pid) == pid and os.getsid(pid) not in (first["sid"], second["sid"], os.getsid(0))
    assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
    assert os.readlink(f"/proc/{pid}/fd/1") == os.readlink(f"/proc/{pid}/fd/2") == str(svc.log_path)
    assert svc.socket.parent == Path(config.run_root)

    # A third caller (this process) reuses it.
    assert service.client(config).ping()
    assert svc.pid() == pid and service_processes(svc.url) == [pid]


def test_a_stale_socket_is_replaced_by_a_new_service(shared):
    config, svc = shared
    svc.ensure()
    old = svc.pid()
    os.killpg(old, signal.SIGKILL)  # the service dies without cleaning up
    wait_for(lambda: not processes.running(old), 10)
    assert svc.socket.is_socket() and not svc.alive()

    started = time.monotonic()
    assert service.client(config).version()["Version"]
    took = time.monotonic() - started
    new = svc.pid()
    assert new is not None and new != old and svc.alive()
    assert service_processes(svc.url) == [new]
    print(f"restart after a stale socket: {took:.2f} s")


def test_the_service_exits_when_idle_and_the_next_call_starts_it_again(hpc):
    config = load_config(hpc.env)
    svc = service.ApiService(config, idle=3)
    try:
        svc.ensure()
        pid = svc.pid()
        idle = wait_for(lambda: not processes.running(pid), 30, 0.2)
        assert 2.5 <= idle <= 30
        assert not svc.alive()
        assert service.client(config, idle=3).ping()
        assert svc.pid() not in (None, pid)
        print(f"idle exit after {idle:.1f} s (--time 3)")
    finally:
        svc.stop()


def test_the_api_lists_and_runs_squashed_images(squashed_tiny, stack):
    config = load_config(squashed_tiny.env)
    svc = service.ApiService(config, idle=60)
    try:
        client = service.client(config)
        tags = [tag for image in client.images.list() for tag in image.tags]
        assert stack.tiny_image in tags
        raw = client.api.get("/images/json").json()
        entry = next(image for image in raw if stack.tiny_image in (image.get("RepoTags") or []))
        assert entry["ReadOnly"] is True  # from the squashed store; no node-local copy exists
        local = squashed_tiny("images", "--format", "{{.Repository}}").stdout  # podman-hpc's own listing
        assert "tiny" in local
        # podman 4.3's default log driver is k8s-file; podman-py's run() returns logs only for json-file.
        output = client.containers.run(
            stack.tiny_image,
            ["sh", "-c", "echo hello from $(cat /etc/hostname)"],
            remove=True,
            log_config={"Type": "json-file"},
        )
        assert output.startswith(b"hello from")
    finally:
        svc.stop()
