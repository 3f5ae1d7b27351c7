"""How much room a file system has left: what tells a write that failed for want of space (the
squashed store, the node-local storage, the unpack cache) from one that failed otherwise."""

from __future__ import annotations

import os
from pathlib import Path

# mksquashfs, unsquashfs and podman do not always say why a write failed: a file system with less
# than this left once they gave up is full
FULL_BELOW = 4 << 20


def free_bytes(path: Path | str | int) -> int | None:
    """The bytes an unprivileged user may still write on ``path``'s file system (or an open file's);
    None if it cannot be looked at."""
    try:
        st = os.fstatvfs(path) if isinstance(path, int) else os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def looks_full(path: Path | str | int) -> bool:
    """``path``'s file system has less than ``FULL_BELOW`` left."""
    free = free_bytes(path)
    return free is not None and free < FULL_BELOW
