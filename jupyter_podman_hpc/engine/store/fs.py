"""The files of a shared directory tree (a project store), reached without following links.

Every member of a project store may create, rename and replace entries in
its group-writable directories, so a name there can turn into a symbolic
link to one of the user's own files (``images.lock`` -> ``~/.ssh/id_ed25519``)
between two calls. So every step below the tree's root is taken from an
open directory with ``O_NOFOLLOW``:

- a link (or anything else) where a directory or a file should be is
  refused in one line naming it (``EntryRefused``), never followed;
- a file read, written or locked must be a regular file on the tree's own
  device (``fstat``), and a lock file must have one link (a hard link to
  a file elsewhere would make the lock's token write land there);
- modes are changed only with ``fchmod`` on what this process has just
  created (``O_EXCL``, or a ``mkdir`` that succeeded), never on a path.

The root itself is the configured path, followed as the user gave it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..base.files import atomic_write
from ..base.private import describe
from ..errors import PermissionDenied

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO must not hang a reader
_LINKED = (errno.ELOOP, errno.ENOTDIR)


class EntryRefused(PermissionDenied):
    """An entry of a shared tree is not what it must be (a link, another kind of file)."""


def _refused(path: Path, what: str) -> EntryRefused:
    return EntryRefused(
        f"refusing to use {path}: {what} (another member of the store's group "
        f"may have put it there); remove it, or ask its owner to"
    )


class Tree:
    """A directory tree (a store's root) whose entries are reached through descriptors."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def path(self, parts: Sequence[str], name: str = "") -> Path:
        """The path of ``parts`` (and ``name``) under the root, for messages; never opened through."""
        return self.root.joinpath(*parts, name) if name else self.root.joinpath(*parts)

    # --- directories ----------------------------------------------------------

    @contextlib.contextmanager
    def directory(
        self, parts: Sequence[str] = (), create_mode: int | None = None, create: bool = False
    ) -> Iterator[int]:
        """An open descriptor of ``root/parts``; with ``create``, missing directories are made
        (``create_mode``, or the umask's when None)."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for i, part in enumerate(parts):
                parent, fd = fd, -1  # _step closes the parent, whatever happens
                fd = self._step(parent, part, self.path(parts[: i + 1]), create, create_mode)
            yield fd
        finally:
            if fd >= 0:
                os.close(fd)

    def _step(self, fd: int, name: str, path: Path, create: bool, mode: int | None) -> int:
        """The descriptor of ``name`` in ``fd`` (closed), made first if asked and missing."""
        try:
            made = False
            if create:
                try:
                    os.mkdir(name, 0o700 if mode is not None else 0o777, dir_fd=fd)
                    made = True
                except FileExistsError:
                    pass
            try:
                child = os.open(name, _DIR, dir_fd=fd)
            except OSError as err:
                if err.errno in _LINKED:
                    raise _refused(path, "it is a symbolic link or not a directory") from None
                raise
        finally:
            os.close(fd)
        if made and mode is not None:
            st = os.fstat(child)
            if st.st_uid != os.getuid():  # replaced between our mkdir and open: not ours to chmod
                os.close(child)
                raise _refused(path, "it was replaced by another user's directory as it was made")
            os.fchmod(child, mode)
        return child

    @contextlib.contextmanager
    def new_directory(self, parts: Sequence[str], name: str, mode: int | None) -> Iterator[int]:
        """A directory we make now (FileExistsError if the name is taken), open, with ``mode``."""
        with self.directory(parts) as dirfd:
            os.mkdir(name, 0o700 if mode is not None else 0o777, dir_fd=dirfd)
            fd = self._step(os.dup(dirfd), name, self.path(parts, name), False, None)
        try:
            if os.fstat(fd).st_uid != os.getuid():
                raise _refused(self.path(parts, name), "it was replaced by another user's directory as it was made")
            if mode is not None:
                os.fchmod(fd, mode)
            yield fd
        finally:
            os.close(fd)

    # --- files ----------------------------------------------------------------

    def open(self, parts: Sequence[str], name: str) -> int:
        """A regular file opened for reading (FileNotFoundError when missing)."""
        with self.directory(parts) as dirfd:
            return self._open_file(dirfd, name, self.path(parts, name))

    def _open_file(self, dirfd: int, name: str, path: Path, flags: int = _READ) -> int:
        try:
            fd = os.open(name, flags, dir_fd=dirfd)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise _refused(path, "it is a symbolic link") from None
            raise
        try:
            self._check_regular(fd, dirfd, path)
        except BaseException:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def _check_regular(fd: int, dirfd: int, path: Path) -> os.stat_result:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refused(path, "it is not a regular file")
        if st.st_dev != os.fstat(dirfd).st_dev:
            raise _refused(path, "it is on another file system than its directory")
        return st

    def read(self, parts: Sequence[str], name: str) -> bytes | None:
        """The content of a regular file, None when it (or a directory on the way) is missing."""
        try:
            with self.directory(parts) as dirfd:
                fd = self._open_file(dirfd, name, self.path(parts, name))
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as handle:
            return handle.read()

    def lstat(self, parts: Sequence[str], name: str) -> os.stat_result | None:
        """``lstat`` of an entry, None when it or a directory on the way is missing (or a link)."""
        try:
            with self.directory(parts) as dirfd:
                return os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except (FileNotFoundError, EntryRefused):
            return None

    def readlink(self, parts: Sequence[str], name: str) -> str | None:
        """Where the link ``name`` in directory ``parts`` points; None when it is missing, not a link, or
        the directory is refused."""
        try:
            with self.directory(parts) as dirfd:
                return os.readlink(name, dir_fd=dirfd)
        except (FileNotFoundError, EntryRefused):
            return None
        except OSError as err:
            if err.errno == errno.EINVAL:  # not a link
                return None
            raise

    def write(self, parts: Sequence[str], name: str, data: bytes, mode: int | None) -> None:
        """Replace ``name`` atomically (a temporary file created O_EXCL, then renamed)."""
        with self.directory(parts) as dirfd:
            atomic_write(name, data, mode, dir_fd=dirfd)

    def create(self, parts: Sequence[str], name: str, mode: int | None) -> int:
        """A new file, created by us (O_EXCL), open for reading and writing, with ``mode``."""
        with self.directory(parts) as dirfd:
            fd = os.open(
                name,
                os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600 if mode is not None else 0o666,
                dir_fd=dirfd,
            )
        if mode is not None:
            os.fchmod(fd, mode)
        return fd

    def lock_file(self, parts: Sequence[str], name: str, mode: int | None) -> int:
        """A lock file open for writing: the existing one (a regular file with one link), or
        one we create (O_EXCL, ``mode``). A symbolic link is refused, never followed."""
        path = self.path(parts, name)
        with self.directory(parts) as dirfd:
            while True:
                try:
                    fd = self._open_file(dirfd, name, path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
                except PermissionError:
                    st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                    raise PermissionDenied(
                        f"cannot lock {describe(path, st)}: this user may not write it; "
                        f"ask its owner to make it group-writable or remove it"
                    ) from None
                except FileNotFoundError:
                    try:
                        fd = os.open(
                            name,
                            os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                            0o600 if mode is not None else 0o666,
                            dir_fd=dirfd,
                        )
                    except FileExistsError:
                        continue  # made by someone else meanwhile: open theirs
                    if mode is not None:
                        os.fchmod(fd, mode)
                    return fd
                if os.fstat(fd).st_nlink != 1:
                    os.close(fd)
                    raise _refused(path, "it has other hard links")
                return fd

    # --- removing and renaming ------------------------------------------------

    def unlink(self, parts: Sequence[str], name: str) -> None:
        """Remove a file or link (never what a link points to); a missing one is fine."""
        try:
            with self.directory(parts) as dirfd:
                os.unlink(name, dir_fd=dirfd)
        except FileNotFoundError:
            pass

    def rmtree(self, parts: Sequence[str], name: str) -> None:
        """Remove a directory and what it holds, descriptor by descriptor (a link in it is
        removed, not followed; a link in its place is refused); a missing one is fine."""
        try:
            with self.directory(parts) as dirfd:
                st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    raise _refused(self.path(parts, name), "it is not a directory")
                shutil.rmtree(name, dir_fd=dirfd)
        except FileNotFoundError:
            pass

    def rename(self, parts: Sequence[str], source: str, target: str) -> None:
        """Rename ``source`` to ``target`` within directory ``parts``, replacing ``target``."""
        with self.directory(parts) as dirfd:
            os.replace(source, target, src_dir_fd=dirfd, dst_dir_fd=dirfd)

    def symlink(self, parts: Sequence[str], target: str, name: str) -> None:
        """Make the link ``name`` to ``target`` in directory ``parts``."""
        with self.directory(parts) as dirfd:
            os.symlink(target, name, dir_fd=dirfd)

    def names(self, parts: Sequence[str]) -> list[str]:
        """The entries of directory ``parts``; empty when it is missing or refused."""
        try:
            with self.directory(parts) as dirfd:
                return os.listdir(dirfd)
        except (FileNotFoundError, EntryRefused):
            return []


def make_dirs(path: str | os.PathLike, mode: int | None) -> None:
    """``mkdir -p`` where each directory made gets ``mode`` (by fchmod on what we made); the
    existing ancestors are taken as they are."""
    path = Path(os.path.abspath(path))
    missing = []
    while not path.exists():
        missing.append(path.name)
        path = path.parent
    if missing:
        with Tree(path).directory(list(reversed(missing)), mode, create=True):
            pass
