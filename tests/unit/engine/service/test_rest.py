"""The API service's command lines, socket naming and liveness check (no podman needed)."""

import socket
import threading

import pytest

from jupyter_podman_hpc.engine.service import rest as service
from jupyter_podman_hpc.engine.site.config import load_config


def config_for(tmp_path, **extra):
    env = {
        "PODMANHPC_RUN_ROOT": str(tmp_path / "run"),
        "PODMANHPC_GRAPH_ROOT": str(tmp_path / "graph"),
        "SQUASH_DIR": str(tmp_path / "squash"),
        **extra,
    }
    return load_config(env)


def test_shared_service_sees_the_squashed_store_and_exits_when_idle(tmp_path):
    svc = service.ApiService(config_for(tmp_path), idle=42)
    argv = svc.command()
    assert argv[-5:] == ["system", "service", "--time", "42", f"unix://{svc.socket}"]
    assert f"additionalimagestore={tmp_path / 'squash'}" in argv
    assert ["--root", str(tmp_path / "graph")] == argv[argv.index("--root") : argv.index("--root") + 2]
    assert svc.socket.parent == tmp_path / "run" and svc.socket.name.startswith("podman-hpc-api-")
    assert {p.parent for p in (svc.lock_path, svc.log_path, svc.pid_path)} == {tmp_path / "run"}


def test_private_services_do_not_see_the_squashed_store(tmp_path):
    private = service.PrivateService(config_for(tmp_path))
    argv = private.command()
    assert not any("additionalimagestore" in arg for arg in argv)
    assert argv[-5:-1] == ["system", "service", "--time", str(service.PRIVATE_IDLE)]
    assert private.socket != service.PrivateService(config_for(tmp_path)).socket


def test_the_socket_name_follows_the_storage_settings_not_the_idle_time(tmp_path):
    base = service.ApiService(config_for(tmp_path), idle=10)
    assert service.ApiService(config_for(tmp_path), idle=99).socket == base.socket
    other = service.ApiService(config_for(tmp_path, SQUASH_DIR=str(tmp_path / "other")))
    assert other.socket != base.socket and other.socket.parent == base.socket.parent


def test_a_run_root_too_long_for_a_socket_is_refused(tmp_path):
    long_root = "/tmp/" + "x" * 120
    with pytest.raises(service.ServiceError, match="too long"):
        service.ApiService(load_config({"PODMANHPC_RUN_ROOT": long_root}))


def test_ping_tells_a_live_service_from_a_stale_socket(tmp_path):
    assert not service.ping(tmp_path / "missing.sock")
    stale = tmp_path / "stale.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(stale))  # the file of a service that died: nobody accepts
    dead.close()
    assert stale.is_socket() and not service.ping(stale, timeout=1)

    live = tmp_path / "live.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(live))
    server.listen()
    replies = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK", b"HTTP/1.1 404 Not Found\r\n\r\nOK"]

    def answer():
        for reply in replies:
            conn, _ = server.accept()
            conn.recv(4096)
            conn.sendall(reply)
            conn.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        assert service.ping(live)
        assert not service.ping(live)
    finally:
        thread.join(5)
        server.close()


def test_a_service_stopped_by_its_reaper_while_a_stopping_server_looks_at_it_is_no_error(tmp_path, monkeypatch):
    """The reaper thread of a cut-off pull stops the service (process -> None) between the stopping
    server's check of the process and its use: the server's quiesce must not fail (it did, with
    AttributeError, and the server never exited: tests/faults/jupyter/test_server_restart.py)."""
    import subprocess

    private = service.PrivateService(config_for(tmp_path))
    private.process = subprocess.Popen(["sleep", "30"])
    parents = service.processes.parents

    def reaper_stops_it_now():
        private._stop_now(grace=2.0)
        return parents()

    monkeypatch.setattr(service.processes, "parents", reaper_stops_it_now)
    try:
        assert private.kill_containers() == 0
        assert private.process is None
        assert private.quiesce(timeout=1.0) is True
    finally:
        if private.process is not None:
            private.process.kill()
