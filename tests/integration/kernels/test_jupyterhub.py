"""A container kernel in a real JupyterHub: hub and configurable-http-proxy on
127.0.0.1, a local-process spawner starting the stack user's single-user
server, which lists the kernel installed with the CLI in the user's Jupyter
data dir and runs a cell in it over the WebSocket, through the proxy."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.commands import run
from tests.helpers.hubs import Hub, HubSetup
from tests.helpers.kernel_site import BIN, ENGINE_VARS
from tests.helpers.servers import http, run_cell, start_kernel, stop, wait_http
from tests.helpers.stack import unavailable

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def jupyterhub_bin() -> Path:
    hub = BIN / "jupyterhub"
    if not hub.exists() or not (BIN / "jupyterhub-singleuser").exists():
        unavailable(f"jupyterhub is not installed in {BIN.parent}: install the test extras (pip install -e '.[test]')")
    return hub


HUB_CONFIG = """\
c = get_config()  # noqa
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.hub_ip = "127.0.0.1"
{hub_setup}c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = {home_template!r}
c.Spawner.cmd = [{singleuser!r}]
c.Spawner.environment = {spawner_env!r}
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
"""


@pytest.fixture
def hub(kernel_site, configurable_http_proxy, jupyterhub_bin, stack, tmp_path):
    """A running JupyterHub; yields (the hub, the user's home)."""
    root = tmp_path / "hub"
    root.mkdir()
    home_template = str(tmp_path / "homes" / "{username}")
    home = Path(home_template.format(username=stack.user))
    home.mkdir(parents=True)
    hub_setup = HubSetup(root, stack.user, configurable_http_proxy, "kernel-test")
    # the single-user server gets the engine's settings (as a site's spawner would set them);
    # Jupyter's own paths stay the defaults, under the HOME the spawner gives
    spawner_env = {name: kernel_site.env[name] for name in ENGINE_VARS}
    spawner_env["SCRATCH"] = kernel_site.env.get("SCRATCH", "")
    (root / "jupyterhub_config.py").write_text(
        HUB_CONFIG.format(
            hub_setup=hub_setup.config(),
            home_template=home_template,
            singleuser=str(BIN / "jupyterhub-singleuser"),
            spawner_env=spawner_env,
        )
    )
    env = {
        key: value
        for key, value in kernel_site.env.items()
        if not key.startswith("JUPYTER_") and key not in ENGINE_VARS
    }
    env["PATH"] = f"{BIN}:/usr/local/bin:/usr/bin:/bin"
    log_path = root / "hub.log"
    log = open(log_path, "wb")
    process = subprocess.Popen(
        [str(jupyterhub_bin), "-f", str(root / "jupyterhub_config.py")],
        cwd=root,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_http(f"{hub_setup.url}/hub/api", 120, process, log_path)
        yield Hub(hub_setup.url, hub_setup.token, stack.user, "", root, log_path, env), home
    finally:
        stop(process, timeout=60)
        log.close()


def install_as_user(kernel_site, home: Path, *args: str) -> None:
    """The user installs a kernel with the CLI: it lands in their Jupyter data dir, under ``home``."""
    env = {key: value for key, value in kernel_site.env.items() if not key.startswith("JUPYTER_")}
    env["HOME"] = str(home)
    run([str(BIN / "jupyter"), "podman-hpc", "kernel", "install", *args], env=env)


def test_hub_user_runs_a_cell_in_a_container_kernel(kernel_site, hub, stack):
    hub, home = hub
    token, user = hub.token, hub.user
    # started on demand (no pool): the server's default pool is test_hub_user_gets_a_pooled_kernel's
    install_as_user(
        kernel_site, home, stack.base_image, "--name", "hub-base", "--display-name", "Base image (hub)", "--pool", "0"
    )
    assert (home / ".local/share/jupyter/kernels/hub-base/kernel.json").is_file()

    user_url = hub.start_server(timeout=150)

    status, specs = http("GET", f"{user_url}/api/kernelspecs", token)
    assert status == 200, specs
    assert specs["kernelspecs"]["hub-base"]["spec"]["display_name"] == "Base image (hub)"

    kernel_id = start_kernel(user_url, token, "hub-base", hub.log)
    assert kernel_site.container_names(kernel_id) == [f"podman-hpc-kernel-{kernel_id}"]

    out = run_cell(
        user_url,
        token,
        kernel_id,
        "import os; print(open('/etc/os-release').read()); print('home', os.environ['HOME'])",
    )
    assert "VERSION_CODENAME=bookworm" in out and f"home {home}" in out

    status, _ = http("DELETE", f"{user_url}/api/kernels/{kernel_id}", token)
    assert status == 204
    assert kernel_site.containers(kernel_id) == []
    status, _ = hub.api("DELETE", f"/users/{user}/server")
    assert status in (202, 204)


def test_hub_user_gets_a_pooled_kernel(kernel_site, hub, stack):
    """A kernelspec installed as a user does (no pool size: the server's default, one): the
    single-user server starts its container at once, the user's kernel adopts it, and stopping
    the server leaves no container."""
    hub, home = hub
    token, user = hub.token, hub.user
    install_as_user(kernel_site, home, stack.base_image, "--name", "hub-pooled")
    user_url = hub.start_server(timeout=150)
    deadline = time.monotonic() + 90
    while not (pooled := kernel_site.container_names()):
        assert time.monotonic() < deadline, f"no pool container\n{hub.log_tail()}"
        time.sleep(0.5)

    kernel_id = start_kernel(user_url, token, "hub-pooled", hub.log)
    assert kernel_site.container_names(kernel_id) == []  # it adopted the pool's container
    assert pooled[0] in kernel_site.container_names()
    out = run_cell(user_url, token, kernel_id, "import os; print('home', os.environ['HOME'], 'cwd', os.getcwd())")
    assert f"home {home} cwd {home}" in out, out

    status, _ = hub.api("DELETE", f"/users/{user}/server")
    assert status in (202, 204)
    deadline = time.monotonic() + 60
    while kernel_site.containers():  # the kernel and the refilled pool go with the server
        assert time.monotonic() < deadline, kernel_site.containers()
        time.sleep(0.5)
