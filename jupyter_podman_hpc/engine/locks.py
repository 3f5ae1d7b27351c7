"""An exclusive file lock that excludes other processes and other threads alike."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import Iterator

from .errors import PermissionDenied


@contextlib.contextmanager
def flocked(path: str | Path, mode: int = 0o644) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) for the ``with`` block.

    A symbolic link (or anything but a regular file) in its place is refused in one line,
    never followed: in a directory another user can write, a link would make us open (and
    create, with our rights) a file of their choosing."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise PermissionDenied(f"refusing to use the lock file {path}: it is a symbolic link; "
                                   f"remove it and run again") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PermissionDenied(f"refusing to use the lock file {path}: it is not a regular file; "
                                   f"remove it and run again")
        # flock, not lockf: POSIX record locks belong to the process, so a
        # server's threads would not exclude each other.
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
