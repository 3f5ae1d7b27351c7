"""The user's own small files: written so that readers see the old content or the new one,
never a part of it, and read back only when nobody else could have made or changed them;
and the files a container could have written (a job's logs and outputs), read as data:
bounded, never through a link, never blocking on a FIFO."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from ..text import human_bytes

# O_NONBLOCK: opening a FIFO for reading must not wait for a writer (fstat refuses it next)
_UNTRUSTED_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_UNTRUSTED_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def atomic_write(
    path: str | os.PathLike, data: str | bytes, mode: int | None = None, *, dir_fd: int | None = None
) -> None:
    """Write ``data`` to a temporary file beside ``path``, flush it to disk and rename it over
    ``path``. ``mode`` is the new file's mode (else the umask's); with ``dir_fd``, ``path`` is a
    name in that directory. A failure leaves ``path`` as it was and no temporary file behind.

    The temporary file is created with O_EXCL and O_NOFOLLOW and its mode set through its
    descriptor: in a directory others may write, a link planted under the temporary name is
    never followed, and no path is ever chmod-ed."""
    path = Path(path)
    # unique across the nodes sharing a file system and the threads of one process
    tmp_name = f".{path.name}.{os.uname().nodename}.{os.getpid()}.{os.urandom(3).hex()}.tmp"
    tmp = tmp_name if dir_fd is not None else str(path.with_name(tmp_name))
    target = path.name if dir_fd is not None else str(path)
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600 if mode is not None else 0o666,
        dir_fd=dir_fd,
    )
    try:
        with os.fdopen(fd, "wb") as out:
            if mode is not None:
                os.fchmod(out.fileno(), mode)
            out.write(data.encode() if isinstance(data, str) else data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        raise


def read_own_json(path: str | os.PathLike, limit: int = 1 << 16):
    """The JSON value in ``path`` when it is this user's regular file, writable by nobody else
    and at most ``limit`` bytes; None otherwise (missing, a link, planted, too big, not JSON).
    Opened without following a link and checked through the descriptor it is read from."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022 or st.st_size > limit:
            return None
        return json.loads(os.read(fd, limit))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


class UntrustedFile(OSError):
    """A file a container could have written that is not read: a link, not a regular file, or
    (``size`` set) over the size limit. ``str()`` is one line naming it and saying why."""

    def __init__(self, message: str, size: int | None = None):
        super().__init__(message)
        self.size = size


def _refused(path: Path, err: OSError, what: str) -> OSError:
    if err.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO):  # a link, or a socket, where we want ours
        return UntrustedFile(f"{path.name} {what}: not read")
    return err


@contextlib.contextmanager
def _open_untrusted(path: Path, beneath: Path | None) -> Iterator[tuple[int, os.stat_result]]:
    """``path`` open for reading and its fstat, a regular file; below ``beneath`` no link is followed."""
    fd = _open_below(path, beneath, _parts_below(path, beneath))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedFile(f"{path.name} is not a regular file: not read")
        yield fd, st
    finally:
        os.close(fd)


def _parts_below(path: Path, beneath: Path | None) -> tuple[str, ...]:
    """The names to walk from ``beneath`` down to ``path`` (``path`` whole without ``beneath``);
    ValueError when ``path`` is not a file below it."""
    parts = path.relative_to(beneath).parts if beneath is not None else (str(path),)
    if not parts or ".." in parts:
        raise ValueError(f"{path} is not a file below {beneath}")
    return parts


def _open_below(path: Path, beneath: Path | None, parts: tuple[str, ...]) -> int:
    """The file ``parts`` names below ``beneath``, open for reading, each directory on the way
    opened without following a link; the directories are closed again."""
    dir_fd = os.open(beneath, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if beneath is not None else None
    try:
        for part in parts[:-1]:
            dir_fd = _open_child_dir(dir_fd, part)
        try:
            return os.open(parts[-1], _UNTRUSTED_READ, dir_fd=dir_fd)
        except OSError as err:
            raise _refused(path, err, "is a symbolic link") from None
    finally:
        if dir_fd is not None:
            os.close(dir_fd)


def _open_child_dir(dir_fd: int | None, part: str) -> int:
    """The directory ``part`` of ``dir_fd``, not through a link; ``dir_fd`` is closed once it is open
    (left open, for the caller to close, when it is refused)."""
    assert dir_fd is not None  # a path of more than one part is only walked below ``beneath``
    try:
        child = os.open(part, _UNTRUSTED_DIR, dir_fd=dir_fd)
    except OSError as err:
        raise _refused(Path(part), err, "is a symbolic link or not a directory") from None
    os.close(dir_fd)
    return child


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks, left = [], limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_untrusted(path: str | os.PathLike, limit: int, *, beneath: str | os.PathLike | None = None) -> bytes:
    """The content of ``path``, a file a container could have written, as data: a regular file
    (not a link, a FIFO or a device), at most ``limit`` bytes. With ``beneath`` (a directory of the
    host's holding ``path``, such as the job directory) no directory between the two is reached
    through a link either. FileNotFoundError when it is missing; UntrustedFile, one line naming
    the file, when it is not read."""
    path = Path(path)
    with _open_untrusted(path, Path(beneath) if beneath is not None else None) as (fd, st):
        data = _read_at_most(fd, limit + 1)
    if len(data) > limit:  # st_size may have grown since the fstat: the read decides
        size = max(st.st_size, len(data))
        raise UntrustedFile(f"{path.name} is {human_bytes(size)}, over the {human_bytes(limit)} read", size)
    return data


def read_untrusted_log(path: str | os.PathLike, limit: int, *, beneath: str | os.PathLike | None = None) -> str:
    """A log a container could have written (a rank's output), as text for a person (universal
    newlines): a file over ``limit`` bytes gives its last ``limit`` bytes after one line saying so;
    a file that is not read (``read_untrusted``) gives one line saying why; a missing one gives ""."""
    path = Path(path)
    try:
        with _open_untrusted(path, Path(beneath) if beneath is not None else None) as (fd, st):
            cut = st.st_size > limit
            if cut:
                os.lseek(fd, st.st_size - limit, os.SEEK_SET)
            data = _read_at_most(fd, limit)
    except FileNotFoundError:
        return ""
    except UntrustedFile as err:
        return f"{err}\n"
    # universal newlines, as a file read as text: a pty's "\r\n" (a notebook's !command) reads "\n"
    text = data.decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    if cut:
        text = f"[... cut: {path.name} is {human_bytes(st.st_size)}, its last {human_bytes(limit)} follow]\n" + text
    return text
