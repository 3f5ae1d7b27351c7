"""The cluster-in-a-box as the tests see it (what `dev/stack env` exports), and what a test does
when a part of it is missing: fail where the stack is required, else skip."""

import os
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


# Where dev/stack installs configurable-http-proxy from npm (the command below).
CHP_PREFIX = Path("/var/cache/jph-stack/chp")
CHP_INSTALL = f"npm install --prefix {CHP_PREFIX} configurable-http-proxy@5"


def required_directory(name: str) -> Path:
    """The directory that the stack's variable ``name`` names (the site deployment's), or a failure
    or skip saying to build it."""
    value = os.environ.get(name)
    if not value or not Path(value).is_dir():
        unavailable(f"${name} is not a directory: run `dev/stack up` (as root) to build the site environment")
    return Path(value)
