"""An exclusive file lock that excludes other processes and other threads alike."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def flocked(path: str | Path, mode: int = 0o644) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) for the ``with`` block."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, mode)
    try:
        # flock, not lockf: POSIX record locks belong to the process, so a
        # server's threads would not exclude each other.
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
