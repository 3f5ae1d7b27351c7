"""Is a squash file still the one its image record was written for? (sha256, once per node)

Every member of a project store may write into it, and podman-hpc 1.2.2
(and this engine before the check) made squash files group-writable: a
squash file could be rewritten after it was squashed, even while
containers read it, and nothing tied its content to the image. So
``migrate`` records each squash file's sha256 in its image record
(``records.SQUASH_DIGEST``), computed from its own descriptor as soon as
mksquashfs has written the file and before the image is published, and the
mount program checks a squash file against the digests its store records
for its layer before the file's first mount or unpack on a node.

Reading the whole file costs about 0.25 s per 350 MB from the page cache,
so a file is checked once per identity (device, inode, size, mtime, ctime),
remembered in the user's own node-local state (``squash-verified/`` beside
the unpacked copies, or in their directory: ``readpath.node_state_dir``), not
once per container. Writing to a file changes its
mtime and ctime, and nobody can set a ctime back, so a changed file is read
again.

Images squashed by podman-hpc 1.2.2 (or by this engine before the check)
have no digest: they run as before, unchecked. A digest protects a squash
file from changes after it was squashed; the records are the store's
members' to write (any member may publish an image under any name), which
is why a store that only its owner should fill is kept 2750.

Imported by the mount program at every container start: standard modules only.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..base.files import atomic_write
from ..errors import EngineError
from ..site.readpath import node_state_dir
from .fs import Tree
from .records import image_ok, is_id, squash_digest

VERIFIED_DIR = "squash-verified"
_CHUNK = 1 << 20


class SquashChanged(EngineError):
    """A squash file does not match the digest its image record holds."""

    def __init__(self, path: str | os.PathLike, why: str = "it was changed after it was squashed"):
        super().__init__(f"squash file {path} does not match its record: {why}; squash the image again")


class SquashDamaged(EngineError):
    """A squash file is not a whole squashfs image (truncated, overwritten), whatever its record says."""

    def __init__(self, path: str | os.PathLike, why: str):
        super().__init__(f"squash file {path} is damaged: {why}; squash the image again (podman-hpc pull or migrate)")


# squashfs 4.0's superblock: magic, then bytes_used (the image's length) at offset 40
_SUPERBLOCK = 48
_BYTES_USED = slice(40, 48)


def damage(fd: int) -> str:
    """What makes the open file no whole squashfs image ('' when it is one, as far as its
    superblock tells): not one at all, or shorter than the length its superblock records
    (a copy or a write that stopped, a full file system). 48 bytes and a stat: cheap enough
    for every container start and every ``run``."""
    head = os.pread(fd, _SUPERBLOCK, 0)
    size = os.fstat(fd).st_size
    if len(head) < _SUPERBLOCK or head[:4] != b"hsqs":
        return "it is empty" if size == 0 else "it is not a squashfs image (no squashfs superblock)"
    wanted = int.from_bytes(head[_BYTES_USED], "little")
    if wanted > size:
        return f"it is truncated ({size} of its {wanted} bytes)"
    return ""


def verified_dir(unpack_dir: str, graph_root: str) -> Path:
    """Where a user's node remembers the squash files it has checked: with the unpacked copies
    (node-local, the user's own: ``readpath.node_state_dir``), else in the graph root."""
    if unpack_dir:
        return node_state_dir(unpack_dir) / VERIFIED_DIR
    return Path(graph_root) / VERIFIED_DIR


def sha256_of(fd: int) -> str:
    """The sha256 of a whole file, read through its descriptor (not its path)."""
    digest = hashlib.sha256()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    offset = 0
    while True:
        count = os.preadv(fd, [buffer], offset)
        if not count:
            return digest.hexdigest()
        digest.update(view[:count])
        offset += count


def identity(st: os.stat_result) -> str:
    """What changes whenever a file is replaced or written to."""
    return f"{st.st_dev:x}-{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}-{st.st_ctime_ns:x}"


class VerifiedFiles:
    """The digests of squash files already read on this node, by file identity.

    ``directory`` is the user's own private directory (made or verified by
    the caller: ``private.private_dir``, or ``own_dir`` in podman's user namespace).
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)

    def known(self, st: os.stat_result) -> str:
        """The digest remembered for the file ``st`` describes (same device, inode, size and times); "" when
        none."""
        try:
            fd = os.open(self.directory / identity(st), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return ""
        with os.fdopen(fd, "rb") as entry:
            value = entry.read(65).decode(errors="replace").strip()
        return value if is_id(value) else ""

    def remember(self, st: os.stat_result, digest: str) -> None:
        """Remember ``digest`` for the file ``st`` describes, so that the next start need not read it; a
        failure to write is ignored."""
        try:
            atomic_write(self.directory / identity(st), digest + "\n", 0o600)
        except OSError:
            pass  # a cache: the next start reads the file again

    def digest(self, fd: int, path: str | os.PathLike) -> str:
        """The file's sha256: remembered for its identity, else read (and remembered)."""
        before = os.fstat(fd)
        remembered = self.known(before)
        if remembered:
            return remembered
        digest = sha256_of(fd)
        if identity(os.fstat(fd)) != identity(before):
            raise SquashChanged(path, "it was being changed as it was checked")
        self.remember(before, digest)
        return digest


def recorded(store: str | os.PathLike, layer: str) -> tuple[bool, set[str]]:
    """(whether ``store`` has an image whose top layer is ``layer``, the squash digests its
    records hold for it). Records that are not valid are left out."""
    try:
        records = json.loads(Tree(store).read(("overlay-images",), "images.json") or b"[]")
    except (OSError, ValueError, EngineError):
        return False, set()
    if not isinstance(records, list):
        return False, set()
    mine = [r for r in records if image_ok(r) and r.get("layer") == layer]
    return bool(mine), {squash_digest(r) for r in mine} - {""}


def check(fd: int, path: str | os.PathLike, digests: set[str], verified: VerifiedFiles) -> bool:
    """True when the open squash file matches one of ``digests``, False when there are none to
    match (podman-hpc 1.2.2's images); SquashDamaged when it is no whole squashfs image (said
    before a digest mismatch: it tells what happened), SquashChanged when it matches none."""
    why = damage(fd)
    if why:
        raise SquashDamaged(path, why)
    if not digests:
        return False
    if verified.digest(fd, path) not in digests:
        raise SquashChanged(path)
    return True
