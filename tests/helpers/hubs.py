"""A test JupyterHub: what it needs besides its own configuration (``HubSetup``) and the running
hub driven through its API (``Hub``)."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers.servers import free_port, http


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
            _status, model = self.api("GET", f"/users/{self.user}")
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
    chp: str  # the configurable-http-proxy command
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
        return HUB_SETUP_CONFIG.format(
            proxy_port=self.proxy_port,
            hub_port=self.hub_port,
            api_port=self.api_port,
            chp=self.chp,
            root=str(self.root),
            user=self.user,
            service=self.service,
            token=self.token,
        )


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
