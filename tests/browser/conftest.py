"""Browser fixtures: a real JupyterLab and Debian's chromium driven by Playwright.

`jupyterlab` starts `jupyter lab` from the running interpreter's environment
(the one the project is installed in) on 127.0.0.1, with a token, a
throwaway root directory and throwaway Jupyter config/data/runtime/settings
directories, so a user's own settings cannot change what a test sees. The
installed extensions (sys.prefix/share/jupyter, sys.prefix/etc/jupyter) are
still found: that is what is under test.

`stack_lab` is such a JupyterLab on the cluster-in-a-box: its server extension
uses the engine storage of `squashed_base` (tests/integration/conftest.py: a
private graph root and a squashed store holding the base image) and writes job
directories to the shared scratch (`c.PodmanHPC.job_root`), since the nodes
write the ranks' logs there. Tests that use it need the stack.

`page` is a fresh chromium page (fresh profile) whose console messages and
uncaught page errors are collected in `console`. A screenshot of every test's
page is written to tests/artifacts/ (or, if the checkout is not writable by
the test user, to pytest's temporary directory; the path is in `artifacts`).

Playwright never downloads a browser here: it drives /usr/bin/chromium.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import Stack
# The stack's session fixtures, shared with the browser tests (pytest registers imported fixtures).
from tests.integration.conftest import Hpc, squashed_base  # noqa: F401

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


def _unavailable(message: str):
    """Skip, or fail where the whole suite must run (make test, CI)."""
    if os.environ.get("STACK_REQUIRED"):
        pytest.fail(message)
    pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


def _wait_until_up(process: subprocess.Popen, lab: JupyterLab) -> None:
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
    port = _free_port()
    lab = JupyterLab(
        url=f"http://127.0.0.1:{port}/",
        token=uuid.uuid4().hex,
        root_dir=root,
        log=base / "jupyterlab.log",
        data_dir=base / "data",
    )
    command = [
        sys.executable, "-m", "jupyterlab",
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
            command, cwd=root, env=server_env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_until_up(process, lab)
        yield lab
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


@pytest.fixture(scope="session")
def jupyterlab(tmp_path_factory) -> JupyterLab:
    """A JupyterLab server of this environment on 127.0.0.1; stopped at the end."""
    with running_lab(tmp_path_factory.mktemp("jupyterlab")) as lab:
        yield lab


# --- JupyterLab on the stack ----------------------------------------------------------

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


@pytest.fixture(scope="session")
def stack_lab(tmp_path_factory, stack, squashed_base) -> StackLab:
    """JupyterLab with the engine environment of `squashed_base` and job directories on the scratch."""
    job_root = stack.work_dir("browser-jobs")
    env = {name: squashed_base.env[name] for name in ENGINE_VARIABLES}
    try:
        with running_lab(tmp_path_factory.mktemp("stack-lab"), env=env,
                         args=[f"--PodmanHPC.job_root={job_root}"]) as lab:
            yield StackLab(lab=lab, stack=stack, hpc=squashed_base, job_root=job_root)
    finally:
        shutil.rmtree(job_root, ignore_errors=True)


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


@pytest.fixture
def console() -> ConsoleLog:
    return ConsoleLog()


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> Path:
    """Where screenshots go: tests/artifacts/ if writable, else a temporary directory."""
    wanted = Path(os.environ.get("JPH_TEST_ARTIFACTS", REPO / "tests" / "artifacts"))
    try:
        wanted.mkdir(parents=True, exist_ok=True)
        probe = wanted / f".probe-{uuid.uuid4().hex}"
        probe.touch()
        probe.unlink()
        return wanted
    except OSError:
        return tmp_path_factory.mktemp("artifacts")


@pytest.fixture
def page(request, console: ConsoleLog, artifacts: Path, tmp_path):
    """A page of a fresh headless chromium (Debian's), console collected in `console`."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("browser tests need the Python package playwright (the project's [test] extra)")
    if not os.access(CHROMIUM, os.X_OK):
        _unavailable(f"browser tests need Debian's chromium at {CHROMIUM} (apt-get install chromium)")
    profile = tmp_path / "chromium-profile"
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 800},
        )
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.on("console", lambda message: console.messages.append((message.type, message.text)))
            page.on("pageerror", lambda error: console.messages.append(("pageerror", str(error))))
            yield page
            try:
                page.screenshot(path=str(artifacts / f"{request.node.name}.png"), full_page=True)
            except Exception as error:  # a screenshot is a help, never a failure
                print(f"no screenshot of {request.node.name}: {error}")
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)
