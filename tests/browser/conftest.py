"""Browser fixtures: a real JupyterLab and Debian's chromium driven by Playwright.

`jupyterlab` starts `jupyter lab` from the running interpreter's environment
(the one the project is installed in) on 127.0.0.1, with a token, a
throwaway root directory and throwaway Jupyter config/data/runtime/settings
directories, so a user's own settings cannot change what a test sees. The
installed extensions (sys.prefix/share/jupyter, sys.prefix/etc/jupyter) are
still found: that is what is under test.

`page` is a fresh chromium page (fresh profile) whose console messages and
uncaught page errors are collected in `console`. A screenshot of every test's
page is written to tests/artifacts/ (or, if the checkout is not writable by
the test user, to pytest's temporary directory; the path is in `artifacts`).

Playwright never downloads a browser here: it drives /usr/bin/chromium.
"""

from __future__ import annotations

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


@pytest.fixture(scope="session")
def jupyterlab(tmp_path_factory) -> JupyterLab:
    """A JupyterLab server of this environment on 127.0.0.1; stopped at the end."""
    base = tmp_path_factory.mktemp("jupyterlab")
    root = base / "root"
    root.mkdir()
    env = dict(os.environ)
    for name in ("config", "data", "runtime", "settings", "workspaces"):
        (base / name).mkdir()
    env.update(
        JUPYTER_CONFIG_DIR=str(base / "config"),
        JUPYTER_DATA_DIR=str(base / "data"),
        JUPYTER_RUNTIME_DIR=str(base / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(base / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(base / "workspaces"),
    )
    env.pop("JUPYTER_NO_CONFIG", None)  # sys.prefix/etc/jupyter enables our server extension
    port = _free_port()
    lab = JupyterLab(
        url=f"http://127.0.0.1:{port}/",
        token=uuid.uuid4().hex,
        root_dir=root,
        log=base / "jupyterlab.log",
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
    ]
    with lab.log.open("w") as log:
        process = subprocess.Popen(
            command, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
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
