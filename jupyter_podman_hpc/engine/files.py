"""Writing a file so that readers see the old content or the new one, never a part of it."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Callable


def atomic_write(path: str | os.PathLike, data: str | bytes, mode: int | None = None, *,
                 prepare: Callable[[Path], None] | None = None) -> None:
    """Write ``data`` to a temporary file beside ``path``, flush it to disk and rename it over
    ``path``. ``mode`` is the new file's mode; ``prepare`` (e.g. a group's ownership) is applied
    to the temporary file before the rename. A failure leaves ``path`` as it was and no
    temporary file behind."""
    path = Path(path)
    # unique across the nodes sharing a file system and the threads of one process
    tmp = path.with_name(f".{path.name}.{os.uname().nodename}.{os.getpid()}.{secrets.token_hex(3)}.tmp")
    try:
        with open(tmp, "wb") as out:
            out.write(data.encode() if isinstance(data, str) else data)
            out.flush()
            os.fsync(out.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        if prepare is not None:
            prepare(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
