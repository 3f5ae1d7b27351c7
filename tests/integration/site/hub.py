"""A JupyterHub run as docs/operators/site.md says: from the site environment, with
examples/hub/jupyterhub_config.py, plus what a test needs on top (ports, a state
directory, the dummy authenticator, an API token, private Jupyter and podman-hpc
directories for the user's server).

Shared by the hub's integration test and its browser test.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import time
from pathlib import Path

from tests.helpers.commands import run
from tests.helpers.hubs import Hub, HubSetup
from tests.helpers.kernel_site import ENGINE_VARS
from tests.helpers.servers import stop, wait_http

CHECKOUT = Path(__file__).resolve().parents[3]
EXAMPLE = CHECKOUT / "examples" / "hub" / "jupyterhub_config.py"

TEST_CONFIG = """\
c = get_config()  # noqa
load_subconfig({example!r})
{hub_setup}c.DummyAuthenticator.password = {password!r}
c.Authenticator.admin_users = {{{user!r}}}
c.Spawner.environment.update({server_env!r})
c.Spawner.notebook_dir = {notebooks!r}
"""


def server_jobs(user: str) -> list[tuple[str, str, str]]:
    """The user's hub server jobs in the queue: (job id, state, node list)."""
    out = run(["squeue", "--noheader", "--user", user, "--name", f"jupyterhub-{user}", "--format", "%i %T %N"]).stdout
    return [
        tuple(line.split(maxsplit=2)) if len(line.split()) == 3 else (*line.split(), "")
        for line in out.splitlines()
        if line.strip()
    ]


def install_kernel(hub: Hub, site_venv: Path, image: str, name: str, display_name: str, *extra: str) -> None:
    """The user installs a container kernel with the site environment's CLI, into the Jupyter
    path the user's server reads (docs/operators/site.md)."""
    run(
        [
            site_venv / "bin" / "jupyter",
            "podman-hpc",
            "kernel",
            "install",
            image,
            "--name",
            name,
            "--display-name",
            display_name,
            "--prefix",
            hub.root / "prefix",
            *extra,
        ],
        env=hub.env,
    )


def start_hub(*, stack, squashed, site_venv: Path, chp: str) -> Hub:
    """A running hub (stop it with ``stop_hub``); the server's directories on the shared scratch."""
    root = stack.work_dir("hub")
    for sub in ("prefix/share/jupyter", "data", "runtime", "config", "notebooks"):
        (root / sub).mkdir(parents=True)
    user = stack.user
    password = secrets.token_hex(8)
    hub_setup = HubSetup(root, user, chp, "site-test")
    # the server's settings: the squashed store the test filled and node-local storage of
    # its own (podman-hpc's variables), and Jupyter directories of its own on the scratch
    server_env = {name: squashed.env[name] for name in ENGINE_VARS}
    server_env["PODMANHPC_SQUASH_UNPACK_DIR"] = squashed.env["PODMANHPC_SQUASH_UNPACK_DIR"]
    server_env.update(
        JUPYTER_PATH=str(root / "prefix/share/jupyter"),
        JUPYTER_DATA_DIR=str(root / "data"),
        JUPYTER_RUNTIME_DIR=str(root / "runtime"),
        JUPYTER_CONFIG_DIR=str(root / "config"),
        JUPYTER_PLATFORM_DIRS="0",
    )
    (root / "jupyterhub_config.py").write_text(
        TEST_CONFIG.format(
            example=str(EXAMPLE),
            hub_setup=hub_setup.config(),
            password=password,
            user=user,
            server_env=server_env,
            notebooks=str(root / "notebooks"),
        )
    )
    env = {
        key: value for key, value in squashed.env.items() if not key.startswith("JUPYTER") and key not in ENGINE_VARS
    }
    env.update(
        PATH=f"{site_venv}/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        JPH_HUB_NODE_IP="127.0.0.1",
        JPH_HUB_PARTITION=stack.partition,
        JPH_HUB_RUNTIME="0:30:00",
    )
    env.pop("PYTHONPATH", None)
    log = root / "hub.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(site_venv / "bin" / "jupyterhub"), "-f", str(root / "jupyterhub_config.py")],
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    hub = Hub(hub_setup.url, hub_setup.token, user, password, root, log, env)
    hub.process = process  # type: ignore[attr-defined]
    wait_http(f"{hub.url}/hub/api", 120, process, log)
    return hub


def stop_hub(hub: Hub) -> None:
    """Stop the user's server if one runs, then the hub; cancel a server job left in the queue."""
    _, model = hub.api("GET", f"/users/{hub.user}")
    if model.get("servers") or {}:
        try:
            hub.stop_server()
        except AssertionError:
            pass
    stop(hub.process, timeout=60)  # type: ignore[attr-defined]
    for job_id, _, _ in server_jobs(hub.user):
        run(["scancel", job_id], check=False)
    # the server jobs' logs the example's batch script writes to the user's home
    for job_id in re.findall(r"Job submitted\. output: (\d+)", hub.log.read_text(errors="replace")):
        (Path.home() / f".jupyterhub-slurm-{job_id}.log").unlink(missing_ok=True)


def timings_note(hub: Hub, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(path.read_text()) if path.exists() else {}
    previous.update(hub.timings)
    path.write_text(json.dumps(previous, indent=1) + "\n")


def wait_container_gone(hpc, name: str, within: float, what: str) -> None:
    """Until the container ``name`` is no longer among ``hpc``'s; fails with ``what`` after ``within`` s."""
    deadline = time.monotonic() + within
    while name in hpc("ps", "--all", "--format", "{{.Names}}").stdout:
        assert time.monotonic() < deadline, what
        time.sleep(1)
