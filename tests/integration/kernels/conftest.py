"""Fixtures for container kernels on the real stack.

`kernel_site` points this test process (os.environ: the provisioner reads the
engine's settings from the environment of the process that starts kernels)
and its subprocesses (`.env`) at the squashed store holding the base image,
and gives Jupyter throwaway data, runtime, config and kernelspec directories.

The tests that reach kernels as a user does share the rest: a `jupyter server`
(`jupyter_server`), a test JupyterHub (`HubSetup`, `Hub`; tests/integration/site
runs the site's), and a kernel started and run over HTTP (`start_kernel`, `run_cell`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

from jupyter_podman_hpc.kernels import kernelspec
from jupyter_podman_hpc.kernels.orphans import LABEL, POOL_LABEL
from tests.conftest import run as run_command
from tests.integration.conftest import Hpc

ENGINE_VARS = ("PODMANHPC_GRAPH_ROOT", "PODMANHPC_RUN_ROOT", "PODMANHPC_CONFIG_HOME", "SQUASH_DIR")
BIN = Path(sys.executable).parent


@dataclass
class KernelSite:
    hpc: Hpc
    root: Path
    env: dict[str, str]

    @property
    def prefix(self) -> Path:
        return self.root / "prefix"

    def install(self, image: str, name: str, **kwargs) -> kernelspec.ContainerKernel:
        return kernelspec.install(image, name=name, prefix=self.prefix, **kwargs)

    def set_config(self, name: str, **config) -> None:
        """Change a kernelspec's provisioner config (keys the CLI does not offer)."""
        path = self.prefix / "share" / "jupyter" / "kernels" / name / "kernel.json"
        spec = json.loads(path.read_text())
        spec["metadata"]["kernel_provisioner"]["config"].update(config)
        path.write_text(json.dumps(spec))

    def containers(self, kernel_id: str | None = None) -> list[dict]:
        """Kernel containers in the test storage (all states), optionally of one kernel."""
        label = f"{LABEL}={kernel_id}" if kernel_id else LABEL
        out = self.hpc("ps", "--all", "--filter", f"label={label}", "--format", "json").stdout
        return json.loads(out or "[]") or []

    def container_names(self, kernel_id: str | None = None) -> list[str]:
        return [c["Names"][0] for c in self.containers(kernel_id)]

    def wait_gone(self, name: str, timeout: float) -> float:
        """Seconds until the container ``name`` no longer exists (fails after ``timeout``)."""
        started = time.monotonic()
        while name in self.container_names():
            if time.monotonic() - started > timeout:
                pytest.fail(f"container {name} still exists after {timeout} s: {self.containers()}")
            time.sleep(0.2)
        return time.monotonic() - started


def site_env(hpc: Hpc, root: Path) -> dict[str, str]:
    env = dict(hpc.env)
    env.update({
        "JUPYTER_PATH": str(root / "prefix" / "share" / "jupyter"),
        "JUPYTER_DATA_DIR": str(root / "data"),
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
        "JUPYTER_CONFIG_DIR": str(root / "config"),
        "JUPYTER_PLATFORM_DIRS": "0",
        "PATH": f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}",
    })
    return env


def use_env(monkeypatch, env: dict[str, str]) -> None:
    for name in (*ENGINE_VARS, "JUPYTER_PATH", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR",
                 "JUPYTER_CONFIG_DIR", "JUPYTER_PLATFORM_DIRS"):
        monkeypatch.setenv(name, env[name])


def remove_kernel_containers(hpc: Hpc) -> None:
    """Containers a failed test left behind (the storage is the tests' own)."""
    out = hpc("ps", "--all", "--filter", f"label={LABEL}", "--format", "{{.Names}}", check=False).stdout
    names = out.split()
    if names:
        hpc("rm", "--force", "--time", "0", *names, check=False)


def site_over(hpc: Hpc, root: Path, monkeypatch) -> Iterator[KernelSite]:
    """A kernel site on ``hpc``'s squashed store, in this process's environment; then the
    kernel containers a failed test left behind are removed."""
    env = site_env(hpc, root)
    use_env(monkeypatch, env)
    yield KernelSite(hpc, root, env)
    remove_kernel_containers(hpc)


@pytest.fixture
def kernel_site(squashed_base, tmp_path, monkeypatch) -> Iterator[KernelSite]:
    yield from site_over(squashed_base, tmp_path, monkeypatch)


@pytest.fixture
def tiny_site(squashed_tiny, tmp_path, monkeypatch) -> Iterator[KernelSite]:
    """Like kernel_site, with the squashed store that holds the tiny image (no python)."""
    yield from site_over(squashed_tiny, tmp_path, monkeypatch)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, timeout: float, process: subprocess.Popen | None = None, log: Path | None = None,
              headers: dict[str, str] | None = None) -> None:
    """Until ``url`` answers 200 (a proxy's 404 before its backend is up does not count)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if process is not None and process.poll() is not None:
            text = log.read_text()[-4000:] if log and log.exists() else ""
            pytest.fail(f"the server exited with {process.returncode} before answering {url}\n{text}")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:  # refused, or an HTTPError
            pass
        time.sleep(0.2)
    text = log.read_text()[-4000:] if log and log.exists() else ""
    pytest.fail(f"{url} did not answer within {timeout} s\n{text}")


def stop(process: subprocess.Popen, timeout: float = 20) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def processes_mentioning(text: str) -> list[int]:
    """Our processes whose command line contains ``text`` (e.g. a container name)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def http(method: str, url: str, token: str, body: dict | None = None, timeout: float = 120) -> tuple[int, dict]:
    """One JSON request with token auth; (status, decoded body or {})."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read()
            status = response.status
    except urllib.error.HTTPError as err:
        text, status = err.read(), err.code
    try:
        return status, json.loads(text) if text else {}
    except ValueError:
        return status, {"raw": text.decode(errors="replace")}


@contextlib.contextmanager
def jupyter_server(site, root: Path, log_path: Path):
    """`jupyter server` on 127.0.0.1 with a token, in the kernel site's environment, its output appended
    to ``log_path``: (base URL, token, process)."""
    port, token = free_port(), secrets.token_hex(16)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [str(BIN / "jupyter-server"), "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
             "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", "--ServerApp.open_browser=False",
             f"--ServerApp.root_dir={root}"],
            env=site.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_http(f"{base}/api/status", 90, process, log_path, {"Authorization": f"token {token}"})
            yield base, token, process
        finally:
            stop(process)


@dataclass
class Hub:
    """A running test JupyterHub, driven through its API with the service token."""

    url: str
    token: str
    user: str
    password: str
    root: Path
    log: Path
    env: dict[str, str]
    timings: dict[str, float] = field(default_factory=dict)

    def api(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        return http(method, f"{self.url}/hub/api{path}", self.token, body)

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def start_server(self, profile: str | None = None, timeout: float = 300) -> str:
        """Start the user's server, with a profile ("node" or "login") where the hub offers some;
        its URL once ready."""
        status, body = self.api("POST", f"/users/{self.user}/server", {"profile": profile} if profile else None)
        assert status in (201, 202), f"{body}\n{self.log_tail()}"
        return self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        while True:
            status, model = self.api("GET", f"/users/{self.user}")
            server = (model.get("servers") or {}).get("")
            if server and server.get("ready"):
                return f"{self.url}/user/{self.user}"
            if time.monotonic() > deadline:
                pytest.fail(f"the single-user server did not become ready: {model}\n{self.log_tail()}")
            time.sleep(0.5)

    def stop_server(self, timeout: float = 120) -> None:
        status, body = self.api("DELETE", f"/users/{self.user}/server")
        assert status in (202, 204), body
        deadline = time.monotonic() + timeout
        while True:
            _, model = self.api("GET", f"/users/{self.user}")
            if not (model.get("servers") or {}):
                return
            assert time.monotonic() < deadline, f"the server did not stop: {model}\n{self.log_tail()}"
            time.sleep(0.5)


@dataclass
class HubSetup:
    """What a test's JupyterHub needs on top of its own configuration: the proxy, the hub and the
    proxy's API on free ports of 127.0.0.1, its state in ``root``, ``user`` the one allowed user
    (dummy authenticator), and a service whose ``token`` drives the hub's API."""

    root: Path
    user: str
    chp: str                     # the configurable-http-proxy command
    service: str
    token: str = field(default_factory=lambda: secrets.token_hex(24))
    proxy_port: int = field(default_factory=free_port)
    hub_port: int = field(default_factory=free_port)
    api_port: int = field(default_factory=free_port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    def config(self) -> str:
        """The ``jupyterhub_config.py`` lines for all of the above."""
        return HUB_SETUP_CONFIG.format(proxy_port=self.proxy_port, hub_port=self.hub_port, api_port=self.api_port,
                                      chp=self.chp, root=str(self.root), user=self.user, service=self.service,
                                      token=self.token)


HUB_SETUP_CONFIG = """\
c.JupyterHub.port = {proxy_port}
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.ConfigurableHTTPProxy.pid_file = {root!r} + "/proxy.pid"
c.JupyterHub.db_url = "sqlite:///" + {root!r} + "/hub.sqlite"
c.JupyterHub.cookie_secret_file = {root!r} + "/cookie_secret"
c.JupyterHub.pid_file = {root!r} + "/hub.pid"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allowed_users = {{{user!r}}}
c.JupyterHub.services = [{{"name": {service!r}, "api_token": {token!r}}}]
c.JupyterHub.load_roles = [{{
    "name": {service!r},
    "scopes": ["admin:users", "admin:servers", "access:servers", "list:users", "read:users"],
    "services": [{service!r}],
}}]
"""


async def execute_over_websocket(url: str, token: str, code: str, timeout: float = 60) -> tuple[dict, str]:
    """Send an execute_request on a kernel's /channels WebSocket; (the reply's content, stdout text)."""
    import asyncio
    import datetime

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    connection = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {token}"}))
    try:
        msg_id = uuid.uuid4().hex
        session = uuid.uuid4().hex
        connection.write_message(json.dumps({
            "header": {"msg_id": msg_id, "username": "test", "session": session, "msg_type": "execute_request",
                       "version": "5.3", "date": datetime.datetime.now(datetime.timezone.utc).isoformat()},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True},
        }))
        out: list[str] = []
        reply: dict | None = None
        idle = False
        deadline = asyncio.get_running_loop().time() + timeout
        while reply is None or not idle:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise TimeoutError(f"no execute_reply within {timeout} s (stdout so far: {''.join(out)!r})")
            raw = await asyncio.wait_for(connection.read_message(), remaining)
            if raw is None:
                raise ConnectionError("the kernel's WebSocket closed")
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["header"]["msg_type"]
            if kind == "stream" and msg["content"].get("name") == "stdout":
                out.append(msg["content"]["text"])
            elif kind == "execute_reply":
                reply = msg["content"]
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                idle = True
        return reply, "".join(out)
    finally:
        connection.close()


def start_kernel(server_url: str, token: str, name: str, log: Path | None = None) -> str:
    """Start kernel ``name`` through a Jupyter server's REST API (``server_url``: a server's, or a
    hub user's); its id. Should it fail, the tail of ``log`` (the server's or hub's) says why."""
    status, kernel = http("POST", f"{server_url}/api/kernels", token, {"name": name})
    assert status == 201, f"{kernel}\n{log.read_text(errors='replace')[-4000:] if log else ''}"
    return kernel["id"]


def run_cell(server_url: str, token: str, kernel_id: str, code: str) -> str:
    """Run ``code`` in a kernel of a Jupyter server over its WebSocket, as a notebook does; its
    stdout, once it ran without error."""
    ws_url = server_url.replace("http://", "ws://", 1) + f"/api/kernels/{kernel_id}/channels"
    reply, out = asyncio.run(execute_over_websocket(ws_url, token, code))
    assert reply["status"] == "ok", reply
    return out


# --- a kernel started and driven as a front does (the provisioner's tests and those run inside) ---


def start(name: str, **kwargs):
    """A started KernelManager and a ready client, and the seconds it took."""
    started = time.monotonic()
    km = KernelManager(kernel_name=name, kernel_spec_manager=KernelSpecManager())
    km.start_kernel(**kwargs)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    return km, kc, time.monotonic() - started


def run(kc, code: str, timeout: float = 30) -> tuple[dict, str]:
    """Execute ``code``; the reply's content and the stdout text."""
    out: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            out.append(msg["content"]["text"])

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    return reply["content"], "".join(out)


# --- warm pools (tests/integration/kernels/test_pool.py, tests/faults) ---


def pool_containers(site, kernel_name: str) -> list[str]:
    out = site.hpc("ps", "--all", "--filter", f"label={POOL_LABEL}={kernel_name}", "--format", "json").stdout
    return sorted(c["Names"][0] for c in json.loads(out or "[]") or [])


def wait_for(what, condition, timeout: float, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def install(site, stack, name: str, pool: int | None) -> None:
    """Install a kernelspec of the base image with the CLI; ``pool`` None: the server's default pool size."""
    size = ["--pool", str(pool)] if pool is not None else []
    run_command([str(BIN / "jupyter"), "podman-hpc", "kernel", "install", stack.base_image, "--name", name, *size],
                env=site.env)


def open_notebook(base: str, token: str, path: str, kernel_name: str) -> str:
    status, session = http("POST", f"{base}/api/sessions", token, {
        "path": path, "name": os.path.basename(path), "type": "notebook", "kernel": {"name": kernel_name}})
    assert status == 201, session
    return session["kernel"]["id"]
