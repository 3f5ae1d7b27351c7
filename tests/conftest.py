"""Fixtures shared by every test: the cluster-in-a-box and helpers to use it."""

import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Stack:
    """What `dev/stack env` exports, as the tests see it."""

    user: str
    registry: str
    base_image: str
    tiny_image: str
    scratch: Path
    slurm_conf: Path
    partition: str
    nodes: tuple[str, ...]
    venv: Path

    @classmethod
    def from_env(cls) -> "Stack | None":
        try:
            return cls(
                user=os.environ["STACK_USER"],
                registry=os.environ["STACK_REGISTRY"],
                base_image=os.environ["STACK_BASE_IMAGE"],
                tiny_image=os.environ["STACK_TINY_IMAGE"],
                scratch=Path(os.environ["STACK_SCRATCH"]),
                slurm_conf=Path(os.environ["SLURM_CONF"]),
                partition=os.environ["STACK_PARTITION"],
                nodes=tuple(os.environ["STACK_NODES"].split()),
                venv=Path(os.environ["STACK_VENV"]),
            )
        except KeyError:
            return None

    def work_dir(self, prefix: str = "test") -> Path:
        """A fresh directory on the shared scratch that every node sees."""
        path = self.scratch / self.user / "tests" / f"{prefix}-{uuid.uuid4().hex[:8]}"
        path.mkdir(parents=True)
        return path


def unavailable(message: str):
    """A part of the stack is missing: a failure where the stack is required, else a skip."""
    if os.environ.get("STACK_REQUIRED"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def stack() -> Stack:
    found = Stack.from_env()
    if found is None:
        unavailable("the cluster-in-a-box is not in the environment (run tests with `make test`)")
    if os.geteuid() == 0:
        pytest.fail("tests that use the stack run as its unprivileged user, not root (use `make test`)")
    return found


# Where dev/stack installs configurable-http-proxy from npm (the command below).
CHP_PREFIX = Path("/var/cache/jph-stack/chp")
CHP_INSTALL = f"npm install --prefix {CHP_PREFIX} configurable-http-proxy@5"


@pytest.fixture(scope="session")
def configurable_http_proxy() -> str:
    """The configurable-http-proxy command a test's JupyterHub runs: $JPH_CHP, the stack's npm
    prefix, or PATH."""
    candidates = [os.environ.get("JPH_CHP", ""), str(CHP_PREFIX / "node_modules" / ".bin" / "configurable-http-proxy"),
                  shutil.which("configurable-http-proxy") or ""]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    unavailable(f"configurable-http-proxy is not installed: as root, run `{CHP_INSTALL}` "
                "(dev/stack up should), or point JPH_CHP at it")


def run(args, *, check=True, timeout=300, **kwargs) -> subprocess.CompletedProcess:
    """Run a command with text output; on failure the assertion shows its output."""
    result = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, **kwargs)
    if check:
        assert result.returncode == 0, (
            f"{' '.join(map(str, args))} exited {result.returncode}\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
    return result


def library_module(tmp_path: Path, name: str, destinations: list[str], conf_dir: str) -> Path:
    """A modules.d (returned) with one module, ``--name``, whose ``copy`` puts a freshly built
    ``lib<name>.so.1`` into each of ``destinations`` and an ld.so.conf.d file naming ``conf_dir``."""
    modules = tmp_path / "modules.d"
    modules.mkdir()
    library = tmp_path / f"lib{name}.so.1"
    source = tmp_path / f"{name}.c"
    source.write_text(f"int {name}_answer(void) {{ return 42; }}\n")
    run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,lib{name}.so.1", "-o", library, source])
    (tmp_path / f"{name}.conf").write_text(f"{conf_dir}\n")
    copies = "".join(f"  - {library}:{destination}\n" for destination in destinations)
    (modules / f"{name}.yaml").write_text(
        f"name: {name}\ncli_arg: {name}\nenv: ENABLE_{name.upper()}\nhelp: test module\n"
        f"copy:\n{copies}  - ../{name}.conf:/etc/ld.so.conf.d/{name}.conf\n")
    for path in (tmp_path, modules):
        path.chmod(0o755)
    return modules


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
