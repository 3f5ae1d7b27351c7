"""A real JupyterLab for the browser tests (``running_lab``), one on the stack (``StackLab``),
Debian's chromium as Playwright drives it, and what a page wrote to its console (``ConsoleLog``).

Playwright never downloads a browser here: it drives /usr/bin/chromium.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers.hpc import Hpc
from tests.helpers.servers import free_port
from tests.helpers.stack import Stack

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path(os.environ.get("JPH_CHROMIUM", "/usr/bin/chromium"))


CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


START_TIMEOUT = 90  # seconds for JupyterLab to answer /api/status


@dataclass(frozen=True)
class JupyterLab:
    url: str  # base URL, ending in "/"
    token: str
    root_dir: Path
    log: Path
    data_dir: Path  # JUPYTER_DATA_DIR of the server (its user kernelspecs)

    def lab_url(self, path: str = "lab") -> str:
        return f"{self.url}{path}?token={self.token}"

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def wait_until_up(process: subprocess.Popen, lab: JupyterLab) -> None:
    request = urllib.request.Request(f"{lab.url}api/status", headers={"Authorization": f"token {lab.token}"})
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"jupyter lab exited with code {process.returncode} while starting:\n{lab.log_tail()}")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.25)
    pytest.fail(f"jupyter lab did not answer {lab.url}api/status within {START_TIMEOUT} s:\n{lab.log_tail()}")


@contextlib.contextmanager
def running_lab(base: Path, *, env: dict[str, str] | None = None, args: list[str] | None = None):
    """`jupyter lab` with throwaway Jupyter directories under ``base``; stopped on exit.

    ``env`` is added to the server's environment (e.g. the engine's storage
    settings), ``args`` to its command line (e.g. ``--PodmanHPC.job_root=...``).
    """
    root = base / "root"
    root.mkdir()
    server_env = dict(os.environ)
    for name in ("config", "data", "runtime", "settings", "workspaces"):
        (base / name).mkdir()
    server_env.update(
        JUPYTER_CONFIG_DIR=str(base / "config"),
        JUPYTER_DATA_DIR=str(base / "data"),
        JUPYTER_RUNTIME_DIR=str(base / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(base / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(base / "workspaces"),
    )
    server_env.pop("JUPYTER_NO_CONFIG", None)  # sys.prefix/etc/jupyter enables our server extension
    # no "get notified about Jupyter news?" toast over the screenshots (and no fetch of the news)
    news = base / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false"}')
    server_env.update(env or {})
    port = free_port()
    lab = JupyterLab(
        url=f"http://127.0.0.1:{port}/",
        token=uuid.uuid4().hex,
        root_dir=root,
        log=base / "jupyterlab.log",
        data_dir=base / "data",
    )
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={lab.token}",
        f"--ServerApp.root_dir={root}",
        *(["--allow-root"] if os.geteuid() == 0 else []),
        *(args or []),
    ]
    with lab.log.open("w") as log:
        process = subprocess.Popen(
            command,
            cwd=root,
            env=server_env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until_up(process, lab)
        yield lab
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


ENGINE_VARIABLES = ("PODMANHPC_GRAPH_ROOT", "PODMANHPC_RUN_ROOT", "PODMANHPC_CONFIG_HOME", "SQUASH_DIR")


@dataclass(frozen=True)
class StackLab:
    """A JupyterLab whose podman-hpc API works on the cluster-in-a-box.

    Its engine uses ``hpc``'s storage (a private graph root and a squashed
    store holding the base image) and writes job directories to ``job_root``
    on the shared scratch, where the nodes write the ranks' logs.
    """

    lab: JupyterLab
    stack: Stack
    hpc: Hpc
    job_root: Path

    def __getattr__(self, name):  # url, token, root_dir, lab_url, log_tail, ...
        return getattr(self.lab, name)


@dataclass
class ConsoleLog:
    """What the page wrote to its console, and its uncaught errors."""

    messages: list[tuple[str, str]] = field(default_factory=list)  # (type, text)

    def texts(self, kind: str | None = None) -> list[str]:
        return [text for type_, text in self.messages if kind is None or type_ == kind]

    @property
    def errors(self) -> list[str]:
        return [f"{type_}: {text}" for type_, text in self.messages if type_ in ("error", "pageerror")]

    def __str__(self) -> str:
        return "\n".join(f"[{type_}] {text}" for type_, text in self.messages) or "(empty console)"
