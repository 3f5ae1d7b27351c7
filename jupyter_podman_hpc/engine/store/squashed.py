"""The squashed image store on disk (a podman graph root is read by ``engine.store.graphroot``).

The squashed store has the layout of a containers/storage overlay image
store, as podman-hpc writes it, so podman reads it as an additional image
store and either tool runs the other's images::

    overlay-images/images.json, images.lock, <image id>/   image records, big data
    overlay-layers/layers.json, layers.lock, <layer>.tar-split.gz
    overlay/<layer>/{diff,link}                             empty layer skeletons
    overlay/l/<link> -> ../<layer>/diff                     short links
    overlay/l/<top link>.squash                             the flattened image

Writes follow one rule: files first, records last. Everything an image
needs is written (under temporary names, then renamed) before its records
appear in the JSON files, and records are removed before files
(``store.remove``). The JSON files are replaced atomically while holding the same fcntl locks
containers/storage takes, and the lock files get a new "last writer" token
so a long-running podman notices the change.

A store whose directory has the setgid bit is a *project store*: its group
shares it, and what is written into it gets the modes ``sharing.Sharing``
says. A store that exists but cannot be read, or written, is refused with
one line naming it and why, before podman sees it or anything is written
(``store.access``).

Every member of a group-writable store can write its records and its
directories, so nothing read from it is trusted as a path: records are
checked as they are read (``records``), every file is reached from a
directory descriptor without following links (``store.fs``), and each
squash file's sha256 is recorded in its image record and checked before a
node first uses it (``squashcheck``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .. import reference
from ..base.commands import LOGGER
from ..base.files import atomic_write
from ..base.locks import lockf_held
from ..base.private import describe
from ..errors import EngineError, ImageNotFound, PermissionDenied
from .access import check_writable, store_root
from .fs import EntryRefused, Tree, make_dirs
from .graphroot import IMAGES, GraphRoot
from .records import image_ok, is_id, is_link, layer_ok, set_squash_digest, split, squash_digest
from .sharing import Sharing
from .squashcheck import VerifiedFiles


@dataclass(frozen=True)
class StoredImage:
    """An image record of a store, with what it takes on disk."""

    id: str
    names: tuple[str, ...]
    top_layer: str
    digest: str = ""
    created: str = ""
    squash_file: str = ""
    size: int = 0
    record: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def short_id(self) -> str:
        """The image id's first 12 hex digits, as podman shows it."""
        return self.id[:12]

    def as_dict(self) -> dict:
        """The record as a front shows it: id, names, digest, created, size and squash file."""
        return {
            "id": self.id,
            "names": list(self.names),
            "digest": self.digest,
            "created": self.created,
            "size": self.size,
            "squash_file": self.squash_file,
        }


# The store's directories, as parts below its root.
LAYERS = ("overlay-layers",)
OVERLAY = ("overlay",)
LINKS = ("overlay", "l")
LOCKS = (".locks",)
RECORD_DIRS = ("overlay-images", "overlay-layers")

_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """Say it once per process (a listing reads a store many times)."""
    if key not in _warned:
        _warned.add(key)
        import logging

        logging.getLogger(LOGGER).warning("podman-hpc: %s", message)


class SquashStore:
    """The squashed image store (``squash_dir``), shared by every node.

    Its records are checked as they are read (``records``: a record whose id
    is not an id is skipped with a warning, never acted on), and its files
    are reached through directory descriptors without following links
    (``store.fs.Tree``).
    """

    def __init__(self, root: str | Path):
        self.root = store_root(root)
        self.tree = Tree(self.root)
        self.images_json = self.root / "overlay-images" / "images.json"
        self.layers_json = self.root / "overlay-layers" / "layers.json"
        self.links = self.root / "overlay" / "l"
        self.sharing = Sharing.of(self.root)

    # --- layout -------------------------------------------------------------

    def _dir_mode(self, parts: tuple[str, ...]) -> int | None:
        return self.sharing.dir_mode(records=parts[0] in RECORD_DIRS)

    def _dir(self, parts: tuple[str, ...]):
        """The directory ``parts``, made (with the store's modes) if missing."""
        return self.tree.directory(parts, self._dir_mode(parts), create=True)

    def init(self) -> None:
        """Create the store's layout if missing; refuse in one line a store we may not write."""
        check_writable(self.root)
        try:
            make_dirs(self.root, self.sharing.dir_mode())
            for parts in (LINKS, IMAGES, LAYERS, LOCKS):
                with self._dir(parts):
                    pass
            for parts, name in ((IMAGES, "images.json"), (LAYERS, "layers.json")):
                # the lock is opened (made if missing) even when the records exist: a planted
                # link is refused before any work is done, not after a squash
                with self._lock(parts, name.replace(".json", ".lock")):
                    if self.tree.lstat(parts, name) is None:
                        self.tree.write(parts, name, b"[]", self.sharing.file_mode())
        except OSError as err:
            raise EngineError(f"cannot create the squashed image store {self.root}: {err.strerror}")

    def _lock(self, parts: tuple[str, ...], name: str):
        """containers/storage's lock on the lock file ``name``, opened without following links
        (``Tree.lock_file``): a member could otherwise swap it for a link to one of our files,
        which the token write of ``_touch`` would overwrite. Its group may write it: other
        members lock it too."""
        return lockf_held(
            str(self.tree.path(parts, name)), lambda: self.tree.lock_file(parts, name, self.sharing.file_mode())
        )

    def squash_path(self, link: str) -> Path:
        """The squash file of the layer whose link is ``link``; EngineError when it is not a link name (the
        store is damaged)."""
        if not is_link(link):
            raise EngineError(f"{link!r} is not a layer link: the squashed store {self.root} is damaged")
        return self.links / f"{link}.squash"

    # --- reading --------------------------------------------------------------

    def _read(self, parts: tuple[str, ...], name: str) -> list:
        data = self.tree.read(parts, name)
        if data is None:
            return []
        try:
            value = json.loads(data or b"[]")
        except ValueError:
            value = None
        if not isinstance(value, list):
            raise EngineError(f"{self.tree.path(parts, name)} is not valid JSON: the squashed store is damaged")
        return value

    def _checked(self, parts: tuple[str, ...], name: str, ok) -> tuple[list[dict], list]:
        """(the valid records of a JSON file, the others), warning once about the others."""
        good, bad = split(self._read(parts, name), ok)
        if bad:
            path = self.tree.path(parts, name)
            warn_once(
                f"records:{path}",
                f"ignoring {len(bad)} record(s) of {path} whose id is not a "
                f"64-digit hex id (a member of the store's group may have written them): "
                f"they are never acted on",
            )
        return good, bad

    def _images(self) -> list[dict]:
        return self._checked(IMAGES, "images.json", image_ok)[0]

    def link_of(self, layer: str) -> str:
        """The short link of a layer the store has, else '' (also for a link that is not one)."""
        if not is_id(layer):
            return ""
        try:
            data = self.tree.read((*OVERLAY, layer), "link")
        except EntryRefused as refused:
            warn_once(f"link:{layer}", str(refused))
            return ""
        link = (data or b"").decode(errors="replace").strip()
        if data is not None and not is_link(link):
            warn_once(
                f"link:{layer}",
                f"ignoring the link of layer {layer[:12]} in {self.root}: {link[:40]!r} is not a link name",
            )
            return ""
        return link

    def _squash_stat(self, link: str) -> os.stat_result | None:
        st = self.tree.lstat(LINKS, f"{link}.squash") if link else None
        return st if st is not None and stat.S_ISREG(st.st_mode) else None

    def _stored(self, record: dict) -> StoredImage:
        link = self.link_of(record.get("layer", ""))
        st = self._squash_stat(link)
        return StoredImage(
            id=record["id"],
            names=tuple(record.get("names") or ()),
            top_layer=record.get("layer", ""),
            digest=record.get("digest", ""),
            created=record.get("created", ""),
            squash_file=str(self.squash_path(link)) if link else "",
            size=st.st_size if st else 0,
            record=record,
        )

    def images(self) -> list[StoredImage]:
        """The store's images, in record order."""
        return [self._stored(record) for record in self._images()]

    def find(self, ref: str) -> StoredImage | None:
        """The image named ``ref`` (any of podman's spellings) or with that id prefix."""
        images = self.images()
        for name in reference.candidate_names(ref) if not reference.is_image_id(ref) else []:
            for image in images:
                if name in image.names:
                    return image
        if reference.is_image_id(ref):
            ref = ref.removeprefix("sha256:")
            matches = [image for image in images if image.id.startswith(ref)]
            if len(matches) > 1:
                raise EngineError(f"image id prefix {ref} is ambiguous in the squashed store")
            if matches:
                return matches[0]
            for name in reference.candidate_names(ref):  # a hex-looking short name
                for image in images:
                    if name in image.names:
                        return image
        return None

    def squash_digests(self, layer: str, images: list[dict] | None = None) -> set[str]:
        """The squash digests recorded by the images whose top layer is ``layer`` (they share
        its squash file); empty for podman-hpc 1.2.2's records."""
        images = self._images() if images is None else images
        return {squash_digest(r) for r in images if r.get("layer") == layer} - {""}

    def squash_digest_now(self, link: str, verified: VerifiedFiles) -> str:
        """The sha256 of the squash file of ``link`` as it is now ('' when there is none), read
        once per file identity on this node."""
        try:
            fd = self.tree.open(LINKS, f"{link}.squash")
        except FileNotFoundError:
            return ""
        try:
            return verified.digest(fd, self.squash_path(link))
        finally:
            os.close(fd)

    def has_complete(self, image_id: str, verified: VerifiedFiles | None = None) -> bool:
        """The image's record is present and its squash file exists (and, with ``verified``,
        matches the digest recorded for it, when one is)."""
        images = self._images()
        record = next((r for r in images if r["id"] == image_id), None)
        link = self.link_of(record.get("layer", "")) if record else ""
        if record is None or not link or self._squash_stat(link) is None:
            return False
        if verified is None:
            return True
        digests = self.squash_digests(record["layer"], images)
        return not digests or self.squash_digest_now(link, verified) in digests

    # --- writing --------------------------------------------------------------

    @contextlib.contextmanager
    def image_lock(self, image_id: str) -> Iterator[None]:
        """Serialises migrations of one image across processes and nodes."""
        if not is_id(image_id):
            raise EngineError(f"{image_id!r} is not an image id")
        with self._dir(LOCKS):
            pass
        with self._lock(LOCKS, f"{image_id}.lock"):
            yield

    @contextlib.contextmanager
    def squash_lock(self, layer: str) -> Iterator[None]:
        """Serialises the making of one layer's squash file (images may share a top layer)."""
        if not is_id(layer):
            raise EngineError(f"{layer!r} is not a layer id")
        with self._dir(LOCKS):
            pass
        with self._lock(LOCKS, f"layer-{layer}.lock"):
            yield

    @contextlib.contextmanager
    def records(self) -> Iterator[tuple[list[dict], list[dict]]]:
        """Both lists of valid records, locked as containers/storage locks them; written back on
        success (with the invalid records they skipped, untouched)."""
        with self._lock(LAYERS, "layers.lock") as layers_fd, self._lock(IMAGES, "images.lock") as images_fd:
            images, bad_images = self._checked(IMAGES, "images.json", image_ok)
            layers, bad_layers = self._checked(LAYERS, "layers.json", layer_ok)
            before = (json.dumps(images), json.dumps(layers))
            yield images, layers
            if json.dumps(layers) != before[1]:
                self.tree.write(
                    LAYERS, "layers.json", json.dumps(layers + bad_layers).encode(), self.sharing.file_mode()
                )
                _touch(layers_fd)
            if json.dumps(images) != before[0]:
                self.tree.write(
                    IMAGES, "images.json", json.dumps(images + bad_images).encode(), self.sharing.file_mode()
                )
                _touch(images_fd)

    def write_skeleton(self, source: GraphRoot, image_id: str, chain: list[dict]) -> None:
        """Everything but the records and the squash file: big data, tar-splits, layer dirs, links."""
        if self.tree.lstat(IMAGES, image_id) is None:
            self._copy_big_data(source, image_id)
        for layer in chain:
            layer_id = layer["id"]
            split_file = source.tar_split(layer_id)
            name = f"{layer_id}.tar-split.gz"
            if split_file.exists() and self.tree.lstat(LAYERS, name) is None:
                self.tree.write(LAYERS, name, split_file.read_bytes(), self.sharing.file_mode())
            with self._dir((*OVERLAY, layer_id, "diff")):
                pass
            # A layer the store has keeps its link: another image's squash file is named by it
            # (the base image's top layer is a parent of every image built FROM it).
            link = self.link_of(layer_id) or source.link(layer_id)
            if not self.link_of(layer_id):
                self.tree.write((*OVERLAY, layer_id), "link", link.encode(), self.sharing.file_mode())
            target = f"../{layer_id}/diff"
            if self.tree.readlink(LINKS, link) != target:
                tmp = f".{link}.{os.getpid()}.{os.urandom(3).hex()}.tmp"
                self.tree.symlink(LINKS, target, tmp)
                try:
                    self.tree.rename(LINKS, tmp, link)
                except OSError:
                    self.tree.unlink(LINKS, tmp)
                    raise

    def _copy_big_data(self, source: GraphRoot, image_id: str) -> None:
        """The image's manifest, config and signatures (flat files), in a directory of our own
        renamed into place; podman keeps them 0600: other members must read them."""
        tmp = f".{image_id}.{os.uname().nodename}.{os.getpid()}.tmp"
        with contextlib.suppress(OSError, EngineError):
            self.tree.rmtree(IMAGES, tmp)  # a killed migrate's
        mode = self.sharing.file_mode()
        with (
            self.tree.new_directory(IMAGES, tmp, self._dir_mode(IMAGES)) as dirfd,
            os.scandir(source.big_data(image_id)) as entries,
        ):
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    atomic_write(entry.name, Path(entry.path).read_bytes(), mode, dir_fd=dirfd)
        try:
            self.tree.rename(IMAGES, tmp, image_id)
        except OSError as err:
            with contextlib.suppress(OSError, EngineError):
                self.tree.rmtree(IMAGES, tmp)
            if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise

    def new_squash(self, link: str) -> tuple[int, Path]:
        """A new partial squash file for ``link``, made by us (O_EXCL) with the store's squash
        mode: (its descriptor, its path for mksquashfs, which writes into it)."""
        name = f".{link}.squash.{os.uname().nodename}.{os.getpid()}"
        self.squash_path(link)  # a valid link
        with self._dir(LINKS):
            pass
        self.tree.unlink(LINKS, name)  # ours, from a killed run with this pid
        return self.tree.create(LINKS, name, self.sharing.squash_mode()), self.links / name

    def install_squash(self, fd: int, partial: Path, link: str) -> None:
        """Rename our partial squash file (``fd``) to the squash file of ``link``; refuse in one
        line if another user's file there cannot be replaced, or ours was swapped meanwhile."""
        target = self.squash_path(link)
        ours = os.fstat(fd).st_ino
        st = self.tree.lstat(LINKS, partial.name)
        if st is None or st.st_ino != ours:
            raise EngineError(f"the partial squash file {partial} was replaced while it was written: squash again")
        try:
            self.tree.rename(LINKS, partial.name, target.name)
        except PermissionError:
            old = self.tree.lstat(LINKS, target.name)
            raise PermissionDenied(
                f"cannot replace the squash file {describe(target, old) if old else target}: "
                f"in this project store only its owner (or the owner of {self.links}) "
                f"may replace it; ask them to remove the image (podman-hpc rmsqi)"
            ) from None
        st = self.tree.lstat(LINKS, target.name)
        if st is None or st.st_ino != ours:
            raise EngineError(f"the squash file {target} was replaced as it was installed: squash again")

    def publish(self, record: dict, chain: list[dict], squash_digest_: str = "") -> StoredImage:
        """Make the image visible: add its layer and image records, moving its names to it.

        A name the image takes is removed from any other image in the store:
        the store never gives one name to two images. ``squash_digest_`` (the
        sha256 of the squash file) goes into every record of that top layer.
        """
        names = list(record.get("names") or [])
        with self.records() as (images, layers):
            _add_layers(layers, chain)
            _take_names(images, record["id"], names)
            _add_or_merge(images, record, names)
            if squash_digest_:
                _note_squash_digest(images, record["layer"], squash_digest_)
            return self._stored(next(image for image in images if image["id"] == record["id"]))

    def add_names(self, image_id: str, names: list[str]) -> StoredImage:
        """Give ``image_id`` the names ``names``, taking them from any other image that held them (as podman
        tag does), under the store's lock; the image as stored after. ImageNotFound if it is not there."""
        with self.records() as (images, _):
            target = next((image for image in images if image["id"] == image_id), None)
            if target is None:
                raise ImageNotFound(f"image {image_id[:12]} is not in the squashed store")
            for other in images:
                if other is not target:
                    other["names"] = [n for n in other.get("names") or [] if n not in names]
            target["names"] = list(target.get("names") or []) + [
                n for n in names if n not in (target.get("names") or [])
            ]
            return self._stored(target)

    def remove_stale_temporaries(self, link: str) -> None:
        """Partial squash files of ``link`` left by killed migrations (call under the squash lock);
        another member's, in a sticky store, stay."""
        for name in self.tree.names(LINKS):
            if name.startswith(f".{link}.squash."):
                with contextlib.suppress(OSError):
                    self.tree.unlink(LINKS, name)


def _add_layers(layers: list[dict], chain: list[dict]) -> None:
    """The layer records of ``chain`` (top first) the store lacks, appended base first."""
    known = {layer["id"] for layer in layers}
    layers.extend(layer for layer in reversed(chain) if layer["id"] not in known)


def _take_names(images: list[dict], image_id: str, names: list[str]) -> None:
    """``names`` taken from every image but ``image_id``: the store never gives one name to two images."""
    for other in images:
        if other["id"] != image_id:
            other["names"] = [n for n in other.get("names") or [] if n not in names]


def _add_or_merge(images: list[dict], record: dict, names: list[str]) -> None:
    """``record`` added to ``images``; one already there keeps its names and flags, gains ``names`` and
    takes the record's other fields."""
    existing = next((image for image in images if image["id"] == record["id"]), None)
    if existing is None:
        images.append(dict(record))
        return
    merged = list(existing.get("names") or [])
    merged += [n for n in names if n not in merged]
    existing.update({k: v for k, v in record.items() if k not in ("names", "flags")})
    existing["names"] = merged


def _note_squash_digest(images: list[dict], layer: str, digest: str) -> None:
    """``digest`` noted in every image record whose top layer is ``layer`` (they share its squash file)."""
    for image in images:
        if image.get("layer") == layer:
            set_squash_digest(image, digest)


def _touch(fd: int) -> None:
    """Write a new last-writer token, as containers/storage's lockfile Touch() does."""
    os.pwrite(fd, os.urandom(32).hex().encode(), 0)  # secrets.token_hex, without its import cost
