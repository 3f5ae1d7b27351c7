"""Attack tests: another stack user (``hpcoutsider`` outside the project, ``hpcuser2`` in it)
tries to turn the engine against the test's user, on the real stack. Each test performs the
attack, shows it refused in one line with nothing run, deleted or changed, and shows the normal
flow still works.

The victim (``victim``), the project's fellow member (``member``) and a project store
(``project_store``) are in tests/conftest.py, shared with the fault tests; ``in_store`` and
``build`` in tests/helpers/attacks.py."""

from pathlib import Path

import pytest

from tests.helpers.hpc import Hpc, cleanup_hpc, make_hpc, squashed_store


@pytest.fixture(scope="session")
def squashed_base(stack):
    """The attack tests' own squashed store holding the base image, apart from the other folders'
    (their leftovers checks see only these tests' containers)."""
    yield from squashed_store(stack, stack.base_image)


@pytest.fixture(scope="session")
def squashed_tiny(stack):
    """The attack tests' own squashed store holding the tiny busybox image."""
    yield from squashed_store(stack, stack.tiny_image)


@pytest.fixture
def outsider(stack) -> Hpc:
    """podman-hpc as hpcoutsider, who is in no group of the victim's."""
    instance = make_hpc(stack, "outsider", user="hpcoutsider")
    yield instance
    cleanup_hpc(instance)


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
