"""Fixtures shared by every test: the cluster-in-a-box, and the fixtures that tests in more than one
folder use (podman-hpc with private storage, squashed stores, a kernel site, the attack tests'
users, a jobs root, the site environment, our server extension's API, JupyterLab on the stack and
a browser page). The suite's hooks: the stack's mark, and its time test by test.

Plain helpers are in tests/helpers (its index lists them); fixtures used in one folder only are
in that folder's conftest.py.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.browser import CHROMIUM, CHROMIUM_ARGS, ENGINE_VARIABLES, REPO, ConsoleLog, StackLab, running_lab
from tests.helpers.commands import run
from tests.helpers.hpc import Hpc, cleanup_hpc, make_hpc, squashed_store
from tests.helpers.kernel_site import KernelSite, site_over
from tests.helpers.stack import CHP_INSTALL, CHP_PREFIX, Stack, required_directory, unavailable


@pytest.fixture(scope="session")
def stack() -> Stack:
    found = Stack.from_env()
    if found is None:
        unavailable("the cluster-in-a-box is not in the environment (run tests with `make test`)")
    if os.geteuid() == 0:
        pytest.fail("tests that use the stack run as its unprivileged user, not root (use `make test`)")
    return found


@pytest.fixture(scope="session")
def configurable_http_proxy() -> str:
    """The configurable-http-proxy command a test's JupyterHub runs: $JPH_CHP, the stack's npm
    prefix, or PATH."""
    candidates = [
        os.environ.get("JPH_CHP", ""),
        str(CHP_PREFIX / "node_modules" / ".bin" / "configurable-http-proxy"),
        shutil.which("configurable-http-proxy") or "",
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    unavailable(
        f"configurable-http-proxy is not installed: as root, run `{CHP_INSTALL}` "
        "(dev/stack up should), or point JPH_CHP at it"
    )


# --- podman-hpc with private storage, and squashed stores (tests/helpers/hpc.py) ----------------------


@pytest.fixture
def hpc(stack):
    instance = make_hpc(stack, "hpc")
    yield instance
    cleanup_hpc(instance)


@pytest.fixture(scope="session")
def squashed_base(stack):
    """A squashed store holding the base image; no node has it locally."""
    yield from squashed_store(stack, stack.base_image)


@pytest.fixture(scope="session")
def squashed_tiny(stack):
    """A squashed store holding the tiny busybox image; no node has it locally."""
    yield from squashed_store(stack, stack.tiny_image)


# --- container kernels (tests/integration/kernels, tests/faults, tests/security) ------------------------


@pytest.fixture
def kernel_site(squashed_base, tmp_path, monkeypatch) -> Iterator[KernelSite]:
    yield from site_over(squashed_base, tmp_path, monkeypatch)


# --- the attack tests' users and project store (tests/security, tests/faults) ---------------------------


@pytest.fixture
def victim(stack) -> Hpc:
    """podman-hpc as the test's user (hpcuser), with fresh private state."""
    instance = make_hpc(stack, "victim")
    yield instance
    cleanup_hpc(instance)


@pytest.fixture
def member(stack) -> Hpc:
    """podman-hpc as hpcuser2, the victim's fellow member of the project group jphproj."""
    instance = make_hpc(stack, "member", user="hpcuser2")
    yield instance
    cleanup_hpc(instance)


@pytest.fixture
def project_store(member):
    """A project store as docs/users/images.md ("Project stores") says to make one now: in the project
    directory, 3770."""
    path = Path(os.environ["STACK_PROJECT_DIR"]) / f"sec-store-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    path.chmod(0o3770)
    yield path
    member.sh("rm", "-rf", path, check=False)  # sticky: what the member made, the member removes
    run(["rm", "-rf", str(path)], check=False)


# --- Slurm jobs and the site environment ----------------------------------------------------------------


@pytest.fixture
def root(stack):
    """A fresh jobs root every node sees, removed afterwards."""
    path = stack.work_dir("jobs")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def site_venv(stack) -> Path:
    return required_directory("STACK_SITE_VENV")


# --- our server extension in-process (tests/integration/server, tests/faults/jupyter) --------------------


@pytest.fixture
def job_root(stack):
    """Job directories must be on the shared scratch: the nodes write the logs there."""
    path = stack.work_dir("server-jobs")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def api(jp_fetch):
    """Call the podman-hpc API: (status, JSON body); errors do not raise."""

    async def call(method, *path, body=None, params=None, headers=None):
        kwargs = {"method": method, "raise_error": False, "params": params, "headers": headers}
        if body is not None:
            kwargs["body"] = body if isinstance(body, (bytes, str)) else json.dumps(body)
        elif method in ("POST", "PUT"):
            kwargs["body"] = "{}"
        response = await jp_fetch("podman-hpc", "api", *path, **kwargs)
        text = response.body.decode() if response.body else ""
        if response.headers.get("Content-Type", "").startswith("text/event-stream"):
            return response.code, text
        return response.code, (json.loads(text) if text else None)

    return call


# --- JupyterLab on the stack and a browser page (tests/browser, tests/security) --------------------------


@pytest.fixture(scope="session")
def stack_lab(tmp_path_factory, stack, squashed_base) -> StackLab:
    """JupyterLab with the engine environment of `squashed_base` and job directories on the scratch."""
    job_root = stack.work_dir("browser-jobs")
    env = {name: squashed_base.env[name] for name in ENGINE_VARIABLES}
    try:
        with running_lab(
            tmp_path_factory.mktemp("stack-lab"), env=env, args=[f"--PodmanHPC.job_root={job_root}"]
        ) as lab:
            yield StackLab(lab=lab, stack=stack, hpc=squashed_base, job_root=job_root)
    finally:
        shutil.rmtree(job_root, ignore_errors=True)


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
        unavailable("browser tests need the Python package playwright (the project's [test] extra)")
    if not os.access(CHROMIUM, os.X_OK):
        unavailable(f"browser tests need Debian's chromium at {CHROMIUM} (apt-get install chromium)")
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
            except Exception as error:  # noqa: BLE001  a screenshot is a help, never a failure
                print(f"no screenshot of {request.node.name}: {error}")
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)


# --- hooks ----------------------------------------------------------------------------------------------


def pytest_collection_modifyitems(items):
    """Tests under tests/integration and tests/security need the stack: mark them so."""
    for item in items:
        if {"integration", "security"} & set(item.path.parts):
            item.add_marker(pytest.mark.integration)


# --- the suite's time, test by test ------------------------------------------------------------------

_PHASE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Remember every phase's duration (``--durations`` prints only the slowest)."""
    _PHASE_SECONDS[f"{report.when} {report.nodeid}"] = round(report.duration, 2)


def pytest_sessionfinish(session):
    """Write them all, slowest first, to tests/artifacts/durations.tsv (where the suite's time goes; if
    the checkout is not writable, nowhere)."""
    path = Path(__file__).resolve().parent / "artifacts" / "durations.tsv"
    rows = sorted(_PHASE_SECONDS.items(), key=lambda item: -item[1])
    try:
        path.parent.mkdir(exist_ok=True)
        path.write_text("".join(f"{seconds}\t{phase}\n" for phase, seconds in rows))
    except OSError:
        pass


def pytest_terminal_summary(terminalreporter):
    """The suite's seconds by folder, largest first: where CI's time went, in the part of its output
    that is kept."""
    folders: dict[str, float] = {}
    for phase, seconds in _PHASE_SECONDS.items():
        folder = "/".join(phase.split(" ", 1)[1].split("::")[0].split("/")[:3])
        folders[folder] = folders.get(folder, 0.0) + seconds
    if folders:
        terminalreporter.section("seconds by folder")
        for folder, seconds in sorted(folders.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{seconds:8.0f}  {folder}")
