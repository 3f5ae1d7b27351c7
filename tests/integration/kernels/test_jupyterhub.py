"""A container kernel in a real JupyterHub: hub and configurable-http-proxy on
127.0.0.1, a local-process spawner starting the stack user's single-user
server, which lists the kernel installed with the CLI in the user's Jupyter
data dir and runs a cell in it over the WebSocket, through the proxy."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import run

from .conftest import BIN, ENGINE_VARS, execute_over_websocket, free_port, http, stop, wait_http

pytestmark = pytest.mark.slow

# Where dev/stack is to install configurable-http-proxy from npm (the command below).
CHP_PREFIX = Path("/var/cache/jph-stack/chp")
CHP_INSTALL = f"npm install --prefix {CHP_PREFIX} configurable-http-proxy@5"


def _unavailable(message: str):
    if os.environ.get("STACK_REQUIRED"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def configurable_http_proxy() -> str:
    """The configurable-http-proxy command: $JPH_CHP, the stack's npm prefix, or PATH."""
    candidates = [os.environ.get("JPH_CHP", ""), str(CHP_PREFIX / "node_modules" / ".bin" / "configurable-http-proxy"),
                  shutil.which("configurable-http-proxy") or ""]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    _unavailable(f"configurable-http-proxy is not installed: as root, run `{CHP_INSTALL}` "
                 "(dev/stack up should), or point JPH_CHP at it")


@pytest.fixture(scope="session")
def jupyterhub_bin() -> Path:
    hub = BIN / "jupyterhub"
    if not hub.exists() or not (BIN / "jupyterhub-singleuser").exists():
        _unavailable(f"jupyterhub is not installed in {BIN.parent}: install the test extras "
                     "(pip install -e '.[test]')")
    return hub


HUB_CONFIG = """\
c = get_config()  # noqa
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {proxy_port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.ConfigurableHTTPProxy.pid_file = {root!r} + "/proxy.pid"
c.JupyterHub.db_url = "sqlite:///" + {root!r} + "/hub.sqlite"
c.JupyterHub.cookie_secret_file = {root!r} + "/cookie_secret"
c.JupyterHub.pid_file = {root!r} + "/hub.pid"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allowed_users = {{{user!r}}}
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = {home_template!r}
c.Spawner.cmd = [{singleuser!r}]
c.Spawner.environment = {spawner_env!r}
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.JupyterHub.services = [{{"name": "kernel-test", "api_token": {token!r}}}]
c.JupyterHub.load_roles = [{{
    "name": "kernel-test",
    "scopes": ["admin:users", "admin:servers", "access:servers", "list:users", "read:users"],
    "services": ["kernel-test"],
}}]
"""


@pytest.fixture
def hub(kernel_site, configurable_http_proxy, jupyterhub_bin, stack, tmp_path):
    """A running JupyterHub; yields (proxy URL, service token, the user's home, log path)."""
    root = tmp_path / "hub"
    root.mkdir()
    home_template = str(tmp_path / "homes" / "{username}")
    home = Path(home_template.format(username=stack.user))
    home.mkdir(parents=True)
    proxy_port, hub_port, api_port = free_port(), free_port(), free_port()
    token = secrets.token_hex(24)
    # the single-user server gets the engine's settings (as a site's spawner would set them);
    # Jupyter's own paths stay the defaults, under the HOME the spawner gives
    spawner_env = {name: kernel_site.env[name] for name in ENGINE_VARS}
    spawner_env["SCRATCH"] = kernel_site.env.get("SCRATCH", "")
    (root / "jupyterhub_config.py").write_text(HUB_CONFIG.format(
        proxy_port=proxy_port, hub_port=hub_port, api_port=api_port, chp=configurable_http_proxy,
        root=str(root), user=stack.user, home_template=home_template,
        singleuser=str(BIN / "jupyterhub-singleuser"), spawner_env=spawner_env, token=token))
    env = {key: value for key, value in kernel_site.env.items()
           if not key.startswith("JUPYTER_") and key not in ENGINE_VARS}
    env["PATH"] = f"{BIN}:/usr/local/bin:/usr/bin:/bin"
    log_path = root / "hub.log"
    log = open(log_path, "wb")
    process = subprocess.Popen([str(jupyterhub_bin), "-f", str(root / "jupyterhub_config.py")], cwd=root,
                               env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{proxy_port}"
    try:
        wait_http(f"{base}/hub/api", 120, process, log_path)
        yield base, token, home, log_path
    finally:
        stop(process, timeout=60)
        log.close()


def start_user_server(base: str, token: str, user: str, log_path: Path) -> str:
    """Spawn the user's single-user server through the hub; its URL once ready."""
    status, body = http("POST", f"{base}/hub/api/users/{user}/server", token)
    assert status in (201, 202), body
    deadline = time.monotonic() + 150
    while True:
        status, model = http("GET", f"{base}/hub/api/users/{user}", token)
        server = (model.get("servers") or {}).get("")
        if server and server.get("ready"):
            return f"{base}/user/{user}"
        if time.monotonic() > deadline:
            pytest.fail(f"the single-user server did not become ready: {model}\n{log_path.read_text()[-4000:]}")
        time.sleep(0.5)


def test_hub_user_runs_a_cell_in_a_container_kernel(kernel_site, hub, stack):
    base, token, home, log_path = hub
    user = stack.user
    # the user installs the kernel with the CLI: it lands in their Jupyter data dir
    env = {key: value for key, value in kernel_site.env.items() if not key.startswith("JUPYTER_")}
    env["HOME"] = str(home)
    run([str(BIN / "jupyter"), "podman-hpc", "kernel", "install", stack.base_image, "--name", "hub-base",
         "--display-name", "Base image (hub)"], env=env)
    assert (home / ".local/share/jupyter/kernels/hub-base/kernel.json").is_file()

    user_url = start_user_server(base, token, user, log_path)

    status, specs = http("GET", f"{user_url}/api/kernelspecs", token)
    assert status == 200, specs
    assert specs["kernelspecs"]["hub-base"]["spec"]["display_name"] == "Base image (hub)"

    status, kernel = http("POST", f"{user_url}/api/kernels", token, {"name": "hub-base"})
    assert status == 201, f"{kernel}\n{log_path.read_text()[-4000:]}"
    kernel_id = kernel["id"]
    assert kernel_site.container_names(kernel_id) == [f"podman-hpc-kernel-{kernel_id}"]

    ws_url = f"ws://127.0.0.1:{base.rsplit(':', 1)[1]}/user/{user}/api/kernels/{kernel_id}/channels"
    reply, out = asyncio.run(execute_over_websocket(
        ws_url, token, "import os; print(open('/etc/os-release').read()); print('home', os.environ['HOME'])"))
    assert reply["status"] == "ok", reply
    assert "VERSION_CODENAME=bookworm" in out and f"home {home}" in out

    status, _ = http("DELETE", f"{user_url}/api/kernels/{kernel_id}", token)
    assert status == 204
    assert kernel_site.containers(kernel_id) == []
    status, _ = http("DELETE", f"{base}/hub/api/users/{user}/server", token)
    assert status in (202, 204)


def test_hub_user_gets_a_pooled_kernel(kernel_site, hub, stack):
    """A kernelspec with a pool: the single-user server starts its container at once, the
    user's kernel adopts it, and stopping the server leaves no container."""
    base, token, home, log_path = hub
    user = stack.user
    env = {key: value for key, value in kernel_site.env.items() if not key.startswith("JUPYTER_")}
    env["HOME"] = str(home)
    run([str(BIN / "jupyter"), "podman-hpc", "kernel", "install", stack.base_image, "--name", "hub-pooled",
         "--pool", "1"], env=env)
    user_url = start_user_server(base, token, user, log_path)
    deadline = time.monotonic() + 90
    while not (pooled := kernel_site.container_names()):
        assert time.monotonic() < deadline, f"no pool container\n{log_path.read_text()[-4000:]}"
        time.sleep(0.5)

    status, kernel = http("POST", f"{user_url}/api/kernels", token, {"name": "hub-pooled"})
    assert status == 201, f"{kernel}\n{log_path.read_text()[-4000:]}"
    kernel_id = kernel["id"]
    assert kernel_site.container_names(kernel_id) == []  # it adopted the pool's container
    assert pooled[0] in kernel_site.container_names()
    ws_url = f"ws://127.0.0.1:{base.rsplit(':', 1)[1]}/user/{user}/api/kernels/{kernel_id}/channels"
    reply, out = asyncio.run(execute_over_websocket(
        ws_url, token, "import os; print('home', os.environ['HOME'], 'cwd', os.getcwd())"))
    assert reply["status"] == "ok", reply
    assert f"home {home} cwd {home}" in out, out

    status, _ = http("DELETE", f"{base}/hub/api/users/{user}/server", token)
    assert status in (202, 204)
    deadline = time.monotonic() + 60
    while kernel_site.containers():  # the kernel and the refilled pool go with the server
        assert time.monotonic() < deadline, kernel_site.containers()
        time.sleep(0.5)
