"""Paths inside a container's root file system, resolved as the container will see them.

The OCI hook writes into an image's root from outside the container, as the user and with
every capability of podman's user namespace, while the host's file systems are in view. A
path such as ``/opt/lib/x`` joined to the root by text would follow the image's symlinks
(``/opt/lib -> /home/you/.ssh``, or ``-> ../../../..``) onto the host. Here every lookup
starts from a descriptor of the root and resolves symlinks and ``..`` inside it, as the
kernel's ``openat2(RESOLVE_IN_ROOT)`` does (used where the kernel has it, Linux 5.6+; a
component-by-component walk with ``O_NOFOLLOW`` that reads each symlink and restarts absolute
ones at the root otherwise). Nothing the image holds can make a lookup leave the root.
"""

from __future__ import annotations

import ctypes
import errno
import os
import posixpath

SYS_OPENAT2 = 437  # the same number on every architecture (syscalls added since Linux 5.1)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
MAX_LINKS = 40  # as the kernel's path walk
DIRECTORY = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = None
_have_openat2: bool | None = None  # unknown until first tried


def _openat2(root_fd: int, path: str, flags: int, mode: int) -> int:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(
        ctypes.c_long(SYS_OPENAT2),
        ctypes.c_int(root_fd),
        os.fsencode(path),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return fd


def open_in_root(root_fd: int, path: str, flags: int = DIRECTORY, mode: int = 0o600) -> int:
    """A descriptor of ``path`` (as the container sees it) below the directory ``root_fd``."""
    global _have_openat2
    if _have_openat2 is not False:
        try:
            fd = _openat2(root_fd, path, flags, mode)
            _have_openat2 = True
            return fd
        except OSError as err:
            if err.errno not in (errno.ENOSYS, errno.EPERM) or _have_openat2:
                raise
            _have_openat2 = False  # an old kernel, or a seccomp filter that refuses it
    return walk(root_fd, path, flags, mode)


def walk(root_fd: int, path: str, flags: int = DIRECTORY, mode: int = 0o600) -> int:
    """``open_in_root`` without openat2: one component at a time, never following a symlink
    in the kernel; a symlink's text is resolved here, its absolute targets from the root and
    ``..`` never above it."""
    walker = _Walker(root_fd, path, flags, mode)
    try:
        return walker.open()
    finally:
        for fd in walker.stack:
            os.close(fd)


def _components(path: str) -> list[str]:
    """A path's names, without the empty and ``.`` ones (``..`` kept: the walk resolves it)."""
    return [p for p in path.split("/") if p not in ("", ".")]


class _Walker:
    """One walk's state: the names left, the descriptors from the root down to the current
    directory, the symlinks followed so far."""

    def __init__(self, root_fd: int, path: str, flags: int, mode: int):
        self.path, self.flags, self.mode = path, flags, mode
        self.parts = _components(path)
        self.stack = [os.dup(root_fd)]
        self.links = 0

    def open(self) -> int:
        """A descriptor of the path's last component (of the root for an empty path)."""
        while self.parts:
            fd = self._step(self.parts.pop(0))
            if fd is not None:
                return fd
        return os.open(".", self.flags | os.O_CLOEXEC, dir_fd=self.stack[-1])

    def _step(self, name: str) -> int | None:
        """Resolve one name: up for ``..``, into a symlink's text, down into a directory, or
        open the last component (its descriptor; None while names are left)."""
        if name == "..":
            self._up()
            return None
        target = self._link_target(name)
        if target is not None and (self.parts or not self.flags & os.O_NOFOLLOW):
            self._follow(target)
            return None
        return self._descend(name)

    def _up(self) -> None:
        """``..``: the parent directory, never above the root."""
        if len(self.stack) > 1:
            os.close(self.stack.pop())

    def _link_target(self, name: str) -> str | None:
        """The symlink's text, None if ``name`` is not one (EINVAL) or is a missing last component;
        ENOENT for a missing directory on the way."""
        try:
            return os.readlink(name, dir_fd=self.stack[-1])
        except OSError as err:
            if err.errno == errno.ENOENT and self.parts:
                raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), self.path) from None
            return None

    def _follow(self, target: str) -> None:
        """Continue at a symlink's text: from the root when absolute, ELOOP past MAX_LINKS."""
        self.links += 1
        if self.links > MAX_LINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), self.path)
        if target.startswith("/"):
            while len(self.stack) > 1:
                os.close(self.stack.pop())
        self.parts[:0] = _components(target)

    def _descend(self, name: str) -> int | None:
        """Into a directory while names are left (never through a symlink); else the last
        component's descriptor."""
        if self.parts:
            self.stack.append(os.open(name, DIRECTORY | os.O_NOFOLLOW, dir_fd=self.stack[-1]))
            return None
        return os.open(name, self.flags | os.O_NOFOLLOW | os.O_CLOEXEC, self.mode, dir_fd=self.stack[-1])


def make_dirs(root_fd: int, path: str, mode: int = 0o755) -> int:
    """``mkdir -p path`` inside the root; a descriptor (O_PATH) of the directory. A component
    that is a symlink to a missing directory gets that directory made, inside the root."""
    return _make_dirs(root_fd, posixpath.normpath("/" + path), mode, 0)


def _make_dirs(root_fd: int, path: str, mode: int, links: int) -> int:
    try:
        return open_in_root(root_fd, path)
    except FileNotFoundError:
        if path == "/":
            raise
    parent, name = posixpath.split(path)
    parent_fd = _make_dirs(root_fd, parent, mode, links)
    try:
        try:
            target = os.readlink(name, dir_fd=parent_fd)
        except OSError:
            target = None
        if target is None:
            try:
                os.mkdir(name, mode, dir_fd=parent_fd)
            except FileExistsError:
                pass  # made meanwhile
        elif links >= MAX_LINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
        else:  # a dangling symlink: make what it points to, as the container sees it
            os.close(_make_dirs(root_fd, posixpath.normpath(posixpath.join(parent, target)), mode, links + 1))
    finally:
        os.close(parent_fd)
    return open_in_root(root_fd, path)
