"""Squashing ("migrating") a local image into the squashed store, and removing it.

The image is flattened with the host's ``mksquashfs`` run inside ``podman
unshare`` (so file ownership is recorded as the container sees it): a
single-layer image straight from its layer directory, a multi-layer one
from ``podman image mount``. No static binary inside the image is needed.
The squash file is written under a temporary name and renamed; the store
records are written last (see ``store``), under a per-image lock, so an
interrupted migration leaves nothing visible and concurrent migrations of
one image from several nodes produce one squash file.

The temporary squash file is created by us (O_EXCL, the store's squash
mode) before mksquashfs writes into it; its sha256 is read from our own
descriptor once mksquashfs is done and goes into the image record
(``squashcheck``), and the node remembers it, so a container started here
next does not read the file again. A squash file already in the store is
reused only when it matches a digest recorded for its layer; anything else
(a file no record vouches for, one squashed by podman-hpc 1.2.2, one that
was changed) is squashed again and replaced.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import struct
import subprocess
import termios
from dataclasses import dataclass
from pathlib import Path

from .. import reference
from ..base.private import private_dir
from ..base.space import free_bytes, looks_full
from ..errors import EngineError, ImageNotFound, PodmanError, StorageFull
from ..podman import Podman
from ..progress import Progress, ProgressCallback, ignore
from ..store import remove as storeremove
from ..store.graphroot import GraphRoot
from ..store.records import is_id
from ..store.squashcheck import VerifiedFiles, sha256_of, verified_dir
from ..store.squashed import SquashStore, StoredImage

SQUASHFS_MAGIC = b"hsqs"
_PROGRESS = re.compile(rb"(\d+)/(\d+)\s+(\d+)%")


@dataclass(frozen=True)
class MigrateResult:
    image: StoredImage
    squashed: bool  # False when the store already had it


def local_image(podman: Podman, ref: str) -> dict | None:
    """``podman image inspect`` of ``ref`` in the node-local storage, or None."""
    result = podman(["image", "inspect"], "--format", "json", ref, squashed=False, check=False)
    if result.returncode != 0:
        return None
    found = json.loads(result.stdout or "null")
    return found[0] if found else None


def migrate(podman: Podman, ref: str, progress: ProgressCallback = ignore) -> MigrateResult:
    """Squash the local image ``ref`` into the user's squashed store (once: an image squashed
    already is only named again), with mksquashfs's progress; StorageFull when the store fills."""
    ref = reference.normalize(ref)
    config = podman.config
    store = SquashStore(config.squash_dir)
    store.init()
    inspected = local_image(podman, ref)
    if inspected is None:
        return _squashed_already(store, ref)
    image_id = _image_id(inspected, ref)
    graph = GraphRoot(config.graph_root)
    record = graph.image_record(image_id)
    chain = graph.layer_chain(record["layer"])
    top = record["layer"]
    names = list(record.get("names") or [])
    verified = VerifiedFiles(private_dir(verified_dir(config.squash_unpack_dir, config.graph_root)))
    try:
        with store.image_lock(image_id), store.squash_lock(top):
            if store.has_complete(image_id, verified):
                progress(Progress("squash", f"{ref} is already squashed", 1, 1))
                return MigrateResult(store.add_names(image_id, names), squashed=False)
            stored = _squash_and_publish(store, podman, ref, image_id, graph, record, chain, verified, progress)
    except OSError as err:
        raise _store_error(store.root, ref, err) from None
    progress(Progress("squash", f"squashed {ref}", 1, 1))
    return MigrateResult(stored, squashed=True)


def _squashed_already(store: SquashStore, ref: str) -> MigrateResult:
    """``ref``, not in the local storage, as the store has it; ImageNotFound when it has not."""
    already = store.find(ref)
    if already is None:
        raise ImageNotFound(f"image {ref} not found in the local storage: pull or build it first")
    return MigrateResult(already, squashed=False)


def _image_id(inspected: dict, ref: str) -> str:
    image_id = inspected["Id"]
    if not is_id(image_id):
        raise EngineError(f"podman gave {image_id!r} as the id of {ref}: not an image id")
    return image_id


def _squash_and_publish(
    store: SquashStore,
    podman: Podman,
    ref: str,
    image_id: str,
    graph: GraphRoot,
    record: dict,
    chain: list[dict],
    verified: VerifiedFiles,
    progress: ProgressCallback,
) -> StoredImage:
    """Squash the image (unless a squash file of its top layer is there and vouched for) and publish its
    records; under the image's and the layer's locks."""
    top = record["layer"]
    link = store.link_of(top) or graph.link(top)
    recorded = store.squash_digests(top)  # an image sharing the top layer shares its squash file
    digest = store.squash_digest_now(link, verified) if recorded else ""
    if digest not in recorded:
        store.remove_stale_temporaries(link)
        digest = _squash_into(store, link, podman, ref, image_id, graph, chain, verified, progress)
    store.write_skeleton(graph, image_id, chain)
    return store.publish(record, chain, digest)


def _store_error(root: Path, ref: str, err: OSError) -> EngineError:
    """The error for an OSError while squashing: the store is full, or what failed."""
    if err.errno in _FULL:
        return _store_full(root, ref)
    return EngineError(f"cannot squash {ref} into {root}: {_why(err)}")


_FULL = (errno.ENOSPC, errno.EDQUOT)


def _store_full(root: Path, ref: str, written: int = 0, free: int | None = None) -> StorageFull:
    if free is None:
        free = free_bytes(root)
    wrote = f" after {written >> 20} MiB of its squash file" if written else ""
    room = f", {free >> 20} MiB free" if free is not None else ""
    return StorageFull(
        f"the squashed store {root} is full (ENOSPC{room}): {ref} was not squashed{wrote}; "
        f"nothing of it was kept and the store's other images are unchanged: free space there "
        f"(or set squash_dir to another store), then squash it again"
    )


def _why(err: OSError) -> str:
    return f"{err.filename}: {err.strerror}" if err.filename else str(err.strerror or err)


def _squash_into(
    store: SquashStore,
    link: str,
    podman: Podman,
    ref: str,
    image_id: str,
    graph: GraphRoot,
    chain: list[dict],
    verified: VerifiedFiles,
    progress: ProgressCallback,
) -> str:
    """Squash the image into the store's squash file of ``link``; its sha256."""
    fd, partial = store.new_squash(link)
    try:
        try:
            _make_squash(podman, image_id, graph, chain, partial, progress)
        except PodmanError as err:
            # mksquashfs only says "Failed to write to output filesystem": a full store is told as such
            if looks_full(fd) and "mksquashfs" in str(err):
                raise _store_full(store.root, ref, os.fstat(fd).st_size, free_bytes(fd)) from None
            raise
        if os.pread(fd, 4, 0) != SQUASHFS_MAGIC:
            raise EngineError(f"mksquashfs did not write a squashfs image to {partial}")
        digest = sha256_of(fd)
        store.install_squash(fd, partial, link)
        verified.remember(os.fstat(fd), digest)  # after the rename, which changed its ctime
        return digest
    finally:
        os.close(fd)
        store.remove_stale_temporaries(link)  # ours, if it failed before the rename


def _make_squash(
    podman: Podman, image_id: str, graph: GraphRoot, chain: list[dict], output: Path, progress: ProgressCallback
) -> None:
    config = podman.config
    mounted = len(chain) > 1
    if mounted:
        source = podman.run(
            podman.command("unshare", *podman.command(["image", "mount"], image_id, squashed=False))
        ).stdout.strip()
    else:
        source = str(graph.diff(chain[0]["id"]))
    try:
        argv = podman.command(
            "unshare", config.mksquashfs_bin, source, str(output), *config.mksquashfs_args, "-noappend", "-progress"
        )
        _run_mksquashfs(podman, argv, progress)
    finally:
        if mounted:
            podman.run(
                podman.command("unshare", *podman.command(["image", "unmount"], "--force", image_id, squashed=False)),
                check=False,
            )


def _run_mksquashfs(podman: Podman, argv: list[str], progress: ProgressCallback) -> None:
    """Run mksquashfs, turning its progress bar into events.

    Its output goes to a pseudo-terminal: into a pipe, mksquashfs buffers the
    bar and only writes it when done.
    """
    leader, follower = os.openpty()
    # a terminal of zero columns gets no progress bar
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    try:
        process = podman.popen(argv, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
    finally:
        os.close(follower)
    tail = b""
    try:
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the terminal's other end is closed, mksquashfs is done
                break
            if not chunk:
                break
            tail = (tail + chunk)[-4096:]
            for match in list(_PROGRESS.finditer(chunk))[-1:]:
                progress(Progress("squash", "squashing", int(match.group(1)), int(match.group(2))))
    finally:
        os.close(leader)
    if process.wait() != 0:
        text = tail.decode(errors="replace").replace("\r", "\n")
        lines = [line for line in text.splitlines() if line.strip()]
        raise PodmanError(f"mksquashfs failed: {lines[-1] if lines else 'no output'}", process.returncode, text)


def remove_squashed(podman: Podman, ref: str) -> tuple[StoredImage, bool]:
    """Remove a name (or, the last name or an id, the whole image) from the squashed store: the
    image, and whether its data was deleted."""
    store = SquashStore(podman.config.squash_dir)
    store.init()
    try:
        return storeremove.remove(store, ref)
    except OSError as err:
        raise EngineError(f"cannot remove {ref} from {store.root}: {_why(err)}") from None
