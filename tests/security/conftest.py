"""Attack tests: another stack user (``hpcoutsider`` outside the project, ``hpcuser2`` in it)
tries to turn the engine against the test's user, on the real stack. Each test performs the
attack, shows it refused in one line with nothing run, deleted or changed, and shows the normal
flow still works."""

import dataclasses
import os
import uuid
from pathlib import Path

import pytest

from tests.conftest import run
from tests.integration.conftest import Hpc, cleanup_hpc, make_hpc, squashed_base, squashed_tiny  # noqa: F401 (fixtures)


@pytest.fixture
def victim(stack) -> Hpc:
    """podman-hpc as the test's user (hpcuser), with fresh private state."""
    instance = make_hpc(stack, "victim")
    yield instance
    cleanup_hpc(instance)


@pytest.fixture
def outsider(stack) -> Hpc:
    """podman-hpc as hpcoutsider, who is in no group of the victim's."""
    instance = make_hpc(stack, "outsider", user="hpcoutsider")
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
    """A project store as docs/users/images.md ("Project stores") says to make one now: in the project directory, 3770."""
    path = Path(os.environ["STACK_PROJECT_DIR"]) / f"sec-store-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    path.chmod(0o3770)
    yield path
    member.sh("rm", "-rf", path, check=False)  # sticky: what the member made, the member removes
    run(["rm", "-rf", str(path)], check=False)


def in_store(hpc: Hpc, store: Path) -> Hpc:
    """``hpc`` with ``store`` as its squashed store; the fixture's own keeps its private one, so
    its clean-up never re-creates a project store removed before it."""
    return dataclasses.replace(hpc, env={**hpc.env, "SQUASH_DIR": str(store)})


def build(hpc: Hpc, tag: str, containerfile: str) -> str:
    """``tag`` built by ``hpc`` from ``containerfile`` (in local storage)."""
    context = hpc.work / f"ctx-{uuid.uuid4().hex[:6]}"
    context.mkdir(parents=True)
    (context / "Containerfile").write_text(containerfile)
    hpc("build", "-t", tag, context)
    return tag


@pytest.fixture
def plant(outsider):
    """Create files as hpcoutsider, left open to everyone; removed (as hpcoutsider) at the end."""
    made: list[str] = []

    def make(path: str | Path, text: str | None = None, mode: str = "0777") -> Path:
        path = Path(path)
        top = next((str(p) for p in [path, *path.parents] if p.parent in (Path("/tmp"), Path("/dev/shm"))), None)
        assert top, f"{path} is not below /tmp or /dev/shm"
        made.append(top)
        if text is None:
            outsider.sh("mkdir", "-p", "-m", "0777", path)
        else:
            outsider.sh("mkdir", "-p", "-m", "0777", path.parent)
            outsider.sh("sh", "-c", 'cat > "$1" && chmod "$2" "$1"', "sh", path, mode, input=text)
        outsider.sh("sh", "-c", 'find "$1" -type d -exec chmod 0777 {} +', "sh", top)
        return path

    yield make
    for top in made:
        outsider.sh("rm", "-rf", top, check=False)
