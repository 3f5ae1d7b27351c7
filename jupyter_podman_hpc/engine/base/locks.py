"""An exclusive file lock that excludes other processes and other threads alike.

``flocked`` locks a path of ours with flock; ``held_flock`` returns a descriptor that holds a
flock (shared, or tried without waiting) for as long as the caller keeps it open, and
``abandoned_lock`` one of a lock file whose holder was killed; ``lockf_held``
takes the fcntl (POSIX) lock containers/storage takes, on a lock file the caller opens (a squashed
store's).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import PermissionDenied


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
            raise PermissionDenied(
                f"refusing to use the lock file {path}: it is a symbolic link; remove it and run again"
            ) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PermissionDenied(
                f"refusing to use the lock file {path}: it is not a regular file; remove it and run again"
            )
        # flock, not lockf: POSIX record locks belong to the process, so a
        # server's threads would not exclude each other.
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


_OPEN_AGAIN = -1  # no descriptor: the directory went between making it and opening the file in it


def held_flock(directory: Path, name: str, how: int, create: bool = True) -> int | None:
    """An open descriptor of ``directory/name`` locked ``how``, still linked there once locked (another
    process may have removed the file a waiter held open). With ``create`` the directory and file are made
    if missing; without, None if there is nothing to lock. None also if LOCK_NB found it taken."""
    path = directory / name
    while True:
        if create:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = _open_to_lock(path, create)
        if fd is None:
            return None
        if fd == _OPEN_AGAIN:
            continue
        if not _locked(fd, how):
            return None
        if _still_linked(fd, path):
            return fd
        os.close(fd)
        if not create:
            return None


def _open_to_lock(path: Path, create: bool) -> int | None:
    """``path`` opened to be locked (made, with ``create``), never through a link; None without ``create``
    when it cannot be opened (nothing there to lock), ``_OPEN_AGAIN`` when its directory went."""
    try:
        return os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o600)
    except OSError as err:
        if not create:
            return None
        if isinstance(err, FileNotFoundError):
            return _OPEN_AGAIN
        raise


def _locked(fd: int, how: int) -> bool:
    """Whether ``fd`` is now locked ``how``; False (and ``fd`` closed) if LOCK_NB found it taken."""
    try:
        fcntl.flock(fd, how)
    except BlockingIOError:
        os.close(fd)
        return False
    return True


def _still_linked(fd: int, path: Path) -> bool:
    """Whether ``path`` is still the file ``fd`` holds (not removed, or replaced, while we waited)."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
    except FileNotFoundError:
        return False


def waited_flock(directory: Path, name: str, how: int) -> int:
    """``held_flock`` that makes the file and waits for the lock (``how`` without LOCK_NB): its descriptor."""
    fd = held_flock(directory, name, how)
    assert fd is not None, "held_flock returns None only without create or with LOCK_NB"
    return fd


# seconds: an unlocked lock file younger than this may be in its holder's first instant (made, not yet locked)
NEW_LOCK_GRACE = 2.0


def abandoned_lock(directory: Path, name: str) -> int | None:
    """A descriptor holding the lock on ``directory/name`` if its holders are gone: nobody holds it, and it
    is older than ``NEW_LOCK_GRACE`` (a holder killed by SIGKILL ran no clean-up); else None."""
    held = held_flock(directory, name, fcntl.LOCK_EX | fcntl.LOCK_NB, create=False)
    if held is not None and time.time() - os.fstat(held).st_mtime < NEW_LOCK_GRACE:
        os.close(held)
        return None
    return held


_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


@contextlib.contextmanager
def lockf_held(key: str, open_lock: Callable[[], int]) -> Iterator[int]:
    """Hold an exclusive fcntl (POSIX) lock, the kind containers/storage and NFS honour, on the
    lock file ``open_lock()`` opens (``key`` names it) for the ``with`` block; yields its descriptor.

    POSIX locks belong to the process, so threads of one process (the Jupyter server) also
    take a per-``key`` thread lock."""
    with _thread_locks_guard:
        thread_lock = _thread_locks.setdefault(key, threading.Lock())
    with thread_lock:
        fd = open_lock()
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # closing releases the lock
