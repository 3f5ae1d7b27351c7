"""Per-user state directories: made by the engine itself and verified before each use.

podman-hpc keeps a user's run root, graph root, podman configuration, hooks
and unpacked images under ``/tmp/<uid>_hpc`` and ``/dev/shm/<uid>_hpc``.
Those parents are world-writable, so anyone can create ``/tmp/<your
uid>_hpc`` before you do (after a reboot or a tmp clean) and plant a
``containers.conf``, a hook or an unpacked "image" in it that your next
podman command would use. So a state directory is trusted only when every
component from ``/`` down to it is:

- owned by root or by the user, and not a symlink below a directory that
  others may write;
- writable by nobody else, unless it is a sticky directory such as ``/tmp``,
  in which case everything below it must be the user's own;

and the directory itself is the user's, with no group or other bits.
A directory the engine creates gets mode 0700. One the user owns that
nobody else could ever write (e.g. left 0755 by podman-hpc 1.2.2) is
tightened to 0700; one another user could have written into is refused,
since what it holds may be planted. Refusals are ``UnsafeDirectory``: one
line naming the path, its owner and mode, and what to do (exit 125).
``trusted_dir`` and ``trusted_file`` judge what the user or root set up
(a site's hooks directory, a kernelspec the server starts by itself) the
same way, without making or changing it.

``describe`` and ``describe_access`` say whose a path is and why it is closed to this
user, for those refusals and for the image stores' (``store.access``).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

from ..errors import PermissionDenied

OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
GROUP_OTHER = 0o077


class UnsafeDirectory(PermissionDenied):
    """A directory the engine would keep state in is not safe from other users."""


def describe(path: str | os.PathLike, st: os.stat_result) -> str:
    """``path is owner:group drwxrwxrwx``, as ``ls -l`` shows it."""
    return f"{path} is {_name(pwd.getpwuid, st.st_uid)}:{_name(grp.getgrgid, st.st_gid)} {stat.filemode(st.st_mode)}"


def _name(lookup, number: int) -> str:
    try:
        return lookup(number)[0]
    except KeyError:
        return str(number)


def user_name(uid: int) -> str:
    """The user's name, or the number when it has none."""
    return _name(pwd.getpwuid, uid)


def group_name(gid: int) -> str:
    """The group's name, or the number when it has none."""
    return _name(grp.getgrgid, gid)


def describe_access(path: Path, want: int = os.W_OK | os.X_OK) -> str:
    """Why this user may not use ``path``: who owns what blocks it, its mode, our relation to it."""
    blocker = next(
        (parent for parent in reversed(path.parents) if parent.exists() and not os.access(parent, os.X_OK)), path
    )
    try:
        st = blocker.stat()
    except OSError as err:
        return f"{blocker}: {err.strerror}"
    owner, group = _name(pwd.getpwuid, st.st_uid), _name(grp.getgrgid, st.st_gid)
    user = _name(pwd.getpwuid, os.getuid())
    where = f"{blocker} is {owner}:{group} {stat.filemode(st.st_mode)}"
    if st.st_uid == os.getuid():
        return f"{where}, and its owner {user} lacks the permission"
    if st.st_gid not in (os.getgid(), *os.getgroups()):
        return f"{where}, and {user} is not a member of group {group}"
    if blocker == path and want & os.W_OK and os.access(path, os.R_OK | os.X_OK):
        return f"{where}: only its owner {owner} may write to it"
    return f"{where}, and its group {group} may not read it"


def private_dir(path: str | os.PathLike) -> Path:
    """``path``, created (mode 0700) or verified as the user's own private directory."""
    path = Path(os.path.abspath(path))
    below_shared = _check_parents(path, create=True)
    st = _make_or_lstat(path)
    _check_own(path, st, below_shared)
    if st.st_mode & GROUP_OTHER:
        if st.st_mode & OTHERS_WRITE:
            raise UnsafeDirectory(
                f"refusing to use {describe(path, st)}: others may have written into it; "
                f"remove it (rm -rf {path}) and run again"
            )
        os.chmod(path, 0o700, follow_symlinks=False)
    return path


def own_dir(path: str | os.PathLike) -> Path:
    """``path``, created (0700) or verified as the user's own private directory, its parents
    not judged: for the mount program, which runs in podman's user namespace, where root's
    directories look like anyone else's; its parents were judged by the podman-hpc that
    started podman."""
    path = Path(path)
    st = _make_or_lstat(path)
    _check_own(path, st, below_shared=True)
    if st.st_mode & OTHERS_WRITE:
        raise UnsafeDirectory(
            f"refusing to use {describe(path, st)}: others may have written into it; "
            f"remove it (rm -rf {path}) and run again"
        )
    return path


def trusted_dir(path: str | os.PathLike) -> Path:
    """``path``, verified as a directory that only root or the user can change (a site's
    hooks directory, say); it is not created."""
    path = Path(os.path.abspath(path))
    below_shared = _check_parents(path, create=False)
    st = os.lstat(path)
    _check_component(path, st, below_shared)
    if stat.S_ISLNK(st.st_mode):
        st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"refusing to use {path}: it is not a directory")
    if st.st_mode & OTHERS_WRITE and not st.st_mode & stat.S_ISVTX:
        raise UnsafeDirectory(f"refusing to use {describe(path, st)}: others may write into it")
    return path


def trusted_file(path: str | os.PathLike) -> Path:
    """``path``, verified as a regular file that only root or the user can change, both where it
    is named and where its links lead (a kernelspec the server would start by itself, say)."""
    path = Path(os.path.abspath(path))
    for route in dict.fromkeys((path, Path(os.path.realpath(path)))):
        trusted_dir(route.parent)
        st = os.lstat(route)
        if st.st_uid not in (0, os.getuid()):
            raise UnsafeDirectory(f"refusing to use {describe(route, st)}: it belongs to another user")
        if stat.S_ISLNK(st.st_mode):
            continue  # its owner is ours or root's; the file it leads to is judged as the next route
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeDirectory(f"refusing to use {route}: it is not a regular file")
        if st.st_mode & OTHERS_WRITE:
            raise UnsafeDirectory(f"refusing to use {describe(route, st)}: others may write to it")
    return path


def _check_parents(path: Path, create: bool) -> bool:
    """Check (and, with ``create``, make) every ancestor of ``path``; whether one of them is a
    directory others may write (so what lies below must be the user's own)."""
    below_shared = False
    for parent in reversed(path.parents):
        st = _make_or_lstat(parent) if create else os.lstat(parent)
        _check_component(parent, st, below_shared)
        if stat.S_ISLNK(st.st_mode):
            st = os.stat(parent)  # a root-owned link such as /var/run -> /run: judge its target
            if not stat.S_ISDIR(st.st_mode):
                raise UnsafeDirectory(f"refusing to use {path}: {parent} is not a directory")
        if st.st_mode & OTHERS_WRITE:
            if not st.st_mode & stat.S_ISVTX and st.st_uid != os.getuid():
                raise UnsafeDirectory(
                    f"refusing to use {path}: {describe(parent, st)}, so others may "
                    f"replace what is in it; choose a directory of your own"
                )
            below_shared = below_shared or st.st_uid != os.getuid() or bool(st.st_mode & stat.S_ISVTX)
    return below_shared


def _check_component(path: Path, st: os.stat_result, below_shared: bool) -> None:
    if below_shared:
        _check_own(path, st, below_shared)
    elif st.st_uid not in (0, os.getuid()):
        raise UnsafeDirectory(f"refusing to use {describe(path, st)}: it belongs to another user")
    elif not (stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise UnsafeDirectory(f"refusing to use {path}: it is not a directory")


def _check_own(path: Path, st: os.stat_result, below_shared: bool) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDirectory(
            f"refusing to use {path}: it is a symbolic link"
            + (" in a directory others may write" if below_shared else "")
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"refusing to use {path}: it is not a directory")
    if st.st_uid != os.getuid():
        raise UnsafeDirectory(
            f"refusing to use {describe(path, st)}: it belongs to another user, who may "
            f"have planted what is in it; ask them or an administrator to remove it, "
            f"or point the setting at a directory of your own"
        )


def _make_or_lstat(path: Path) -> os.stat_result:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        pass
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass  # made by someone else meanwhile: judged like any other
    return os.lstat(path)
