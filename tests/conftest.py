"""Fixtures shared by every test: the cluster-in-a-box and helpers to use it."""

import os
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


@pytest.fixture(scope="session")
def stack() -> Stack:
    found = Stack.from_env()
    if found is None:
        message = "the cluster-in-a-box is not in the environment (run tests with `make test`)"
        if os.environ.get("STACK_REQUIRED"):
            pytest.fail(message)
        pytest.skip(message)
    if os.geteuid() == 0:
        pytest.fail("tests that use the stack run as its unprivileged user, not root (use `make test`)")
    return found


def run(args, *, check=True, timeout=300, **kwargs) -> subprocess.CompletedProcess:
    """Run a command with text output; on failure the assertion shows its output."""
    result = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, **kwargs)
    if check:
        assert result.returncode == 0, (
            f"{' '.join(map(str, args))} exited {result.returncode}\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
    return result


def pytest_collection_modifyitems(items):
    """Tests under tests/integration and tests/security need the stack: mark them so."""
    for item in items:
        if {"integration", "security"} & set(item.path.parts):
            item.add_marker(pytest.mark.integration)
