"""What the attack tests share: an Hpc that uses a project store as its squashed store, and an
image built from a Containerfile."""

import dataclasses
import uuid
from pathlib import Path

from tests.helpers.hpc import Hpc


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
