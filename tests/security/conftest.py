"""Attack tests: another stack user (``hpcoutsider`` outside the project, ``hpcuser2`` in it)
tries to turn the engine against the test's user, on the real stack. Each test performs the
attack, shows it refused in one line with nothing run, deleted or changed, and shows the normal
flow still works."""

import pytest

from tests.integration.conftest import Hpc, cleanup_hpc, make_hpc, squashed_tiny  # noqa: F401 (fixtures)


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
