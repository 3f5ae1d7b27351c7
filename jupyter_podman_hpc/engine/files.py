"""The user's own small files: written so that readers see the old content or the new one,
never a part of it, and read back only when nobody else could have made or changed them."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path


def atomic_write(path: str | os.PathLike, data: str | bytes, mode: int | None = None, *,
                 dir_fd: int | None = None) -> None:
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
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600 if mode is not None else 0o666, dir_fd=dir_fd)
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
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022 \
                or st.st_size > limit:
            return None
        return json.loads(os.read(fd, limit))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
