"""Image stores on disk: the squashed store, and reading a podman graph root.

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
appear in the JSON files, and records are removed before files. The JSON
files are replaced atomically while holding the same fcntl locks
containers/storage takes, and the lock files get a new "last writer" token
so a long-running podman notices the change.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from . import reference
from .errors import EngineError, ImageNotFound


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
        return self.id[:12]

    def as_dict(self) -> dict:
        return {"id": self.id, "names": list(self.names), "digest": self.digest,
                "created": self.created, "size": self.size, "squash_file": self.squash_file}


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.uname().nodename}.{os.getpid()}.tmp")
    with open(tmp, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[int]:
    """An exclusive fcntl (POSIX) lock, the kind containers/storage and NFS honour.

    POSIX locks belong to the process, so threads of one process (the
    Jupyter server) also take a per-path thread lock.
    """
    with _thread_locks_guard:
        thread_lock = _thread_locks.setdefault(str(path), threading.Lock())
    with thread_lock:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # closing releases the lock


class GraphRoot:
    """Read access to a podman overlay graph root (the node-local storage)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def _json(self, name: str) -> list[dict]:
        try:
            return json.loads((self.root / name).read_text() or "[]")
        except FileNotFoundError:
            return []

    def image_record(self, image_id: str) -> dict:
        for record in self._json("overlay-images/images.json"):
            if record["id"] == image_id:
                return record
        raise ImageNotFound(f"image {image_id[:12]} is not in the local storage {self.root}")

    def layer_chain(self, top: str) -> list[dict]:
        """The layer records from ``top`` down to the base layer."""
        layers = {record["id"]: record for record in self._json("overlay-layers/layers.json")}
        chain, current = [], top
        while current:
            if current not in layers:
                raise EngineError(f"layer {current[:12]} of the image is missing from {self.root}")
            chain.append(layers[current])
            current = layers[current].get("parent", "")
        return chain

    def link(self, layer: str) -> str:
        return (self.root / "overlay" / layer / "link").read_text().strip()

    def diff(self, layer: str) -> Path:
        return self.root / "overlay" / layer / "diff"

    def big_data(self, image_id: str) -> Path:
        return self.root / "overlay-images" / image_id

    def tar_split(self, layer: str) -> Path:
        return self.root / "overlay-layers" / f"{layer}.tar-split.gz"


class SquashStore:
    """The squashed image store (``squash_dir``), shared by every node."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.images_json = self.root / "overlay-images" / "images.json"
        self.layers_json = self.root / "overlay-layers" / "layers.json"
        self.links = self.root / "overlay" / "l"

    # --- layout -------------------------------------------------------------

    def init(self) -> None:
        try:
            for directory in (self.links, self.images_json.parent, self.layers_json.parent, self.lock_dir):
                directory.mkdir(parents=True, exist_ok=True)
            for path in (self.images_json, self.layers_json):
                if not path.exists():
                    with _locked(self._lock_file(path)):
                        if not path.exists():
                            _atomic_write(path, b"[]")
        except OSError as err:
            raise EngineError(f"cannot create the squashed image store {self.root}: {err.strerror}")

    @property
    def lock_dir(self) -> Path:
        return self.root / ".locks"

    @staticmethod
    def _lock_file(json_path: Path) -> Path:
        return json_path.with_suffix(".lock")

    def squash_path(self, link: str) -> Path:
        return self.links / f"{link}.squash"

    # --- reading --------------------------------------------------------------

    def _read(self, path: Path) -> list[dict]:
        try:
            return json.loads(path.read_text() or "[]")
        except FileNotFoundError:
            return []
        except ValueError:
            raise EngineError(f"{path} is not valid JSON: the squashed store is damaged")

    def _link_of(self, layer: str) -> str:
        try:
            return (self.root / "overlay" / layer / "link").read_text().strip()
        except OSError:
            return ""

    def _stored(self, record: dict) -> StoredImage:
        squash = self.squash_path(self._link_of(record["layer"])) if record.get("layer") else None
        try:
            size = squash.stat().st_size if squash else 0
        except OSError:
            size = 0
        return StoredImage(id=record["id"], names=tuple(record.get("names") or ()),
                           top_layer=record.get("layer", ""), digest=record.get("digest", ""),
                           created=record.get("created", ""), squash_file=str(squash or ""),
                           size=size, record=record)

    def images(self) -> list[StoredImage]:
        return [self._stored(record) for record in self._read(self.images_json)]

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

    def has_complete(self, image_id: str) -> bool:
        """The image's record is present and its squash file exists."""
        for image in self.images():
            if image.id == image_id:
                return bool(image.squash_file) and Path(image.squash_file).is_file()
        return False

    # --- writing --------------------------------------------------------------

    @contextlib.contextmanager
    def image_lock(self, image_id: str) -> Iterator[None]:
        """Serialises migrations of one image across processes and nodes."""
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        with _locked(self.lock_dir / f"{image_id}.lock"):
            yield

    @contextlib.contextmanager
    def _records(self) -> Iterator[tuple[list[dict], list[dict]]]:
        """Both record lists, locked as containers/storage locks them; written back on success."""
        with _locked(self._lock_file(self.layers_json)) as layers_fd, \
                _locked(self._lock_file(self.images_json)) as images_fd:
            images, layers = self._read(self.images_json), self._read(self.layers_json)
            before = (json.dumps(images), json.dumps(layers))
            yield images, layers
            if json.dumps(layers) != before[1]:
                _atomic_write(self.layers_json, json.dumps(layers).encode())
                _touch(layers_fd)
            if json.dumps(images) != before[0]:
                _atomic_write(self.images_json, json.dumps(images).encode())
                _touch(images_fd)

    def write_skeleton(self, source: GraphRoot, image_id: str, chain: list[dict]) -> None:
        """Everything but the records and the squash file: big data, tar-splits, layer dirs, links."""
        big_data = self.root / "overlay-images" / image_id
        if not big_data.exists():
            tmp = big_data.with_name(f".{image_id}.{os.uname().nodename}.{os.getpid()}.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(source.big_data(image_id), tmp)
            try:
                os.rename(tmp, big_data)
            except OSError as err:
                shutil.rmtree(tmp, ignore_errors=True)
                if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
        for layer in chain:
            layer_id = layer["id"]
            split = source.tar_split(layer_id)
            target = self.root / "overlay-layers" / f"{layer_id}.tar-split.gz"
            if split.exists() and not target.exists():
                _atomic_write(target, split.read_bytes())
            layer_dir = self.root / "overlay" / layer_id
            (layer_dir / "diff").mkdir(parents=True, exist_ok=True)
            link = source.link(layer_id)
            if self._link_of(layer_id) != link:
                _atomic_write(layer_dir / "link", link.encode())
            symlink = self.links / link
            if not symlink.is_symlink():
                tmp = self.links / f".{link}.{os.getpid()}.tmp"
                tmp.unlink(missing_ok=True)
                tmp.symlink_to(f"../{layer_id}/diff")
                os.replace(tmp, symlink)

    def publish(self, record: dict, chain: list[dict]) -> StoredImage:
        """Make the image visible: add its layer and image records, moving its names to it.

        A name the image takes is removed from any other image in the store:
        the store never gives one name to two images.
        """
        names = list(record.get("names") or [])
        with self._records() as (images, layers):
            known = {layer["id"] for layer in layers}
            layers.extend(layer for layer in reversed(chain) if layer["id"] not in known)
            for other in images:
                if other["id"] != record["id"]:
                    other["names"] = [n for n in other.get("names") or [] if n not in names]
            existing = next((image for image in images if image["id"] == record["id"]), None)
            if existing is None:
                images.append(dict(record))
            else:
                merged = list(existing.get("names") or [])
                merged += [n for n in names if n not in merged]
                existing.update({k: v for k, v in record.items() if k != "names"})
                existing["names"] = merged
            return self._stored(next(image for image in images if image["id"] == record["id"]))

    def add_names(self, image_id: str, names: list[str]) -> StoredImage:
        with self._records() as (images, _):
            target = next((image for image in images if image["id"] == image_id), None)
            if target is None:
                raise ImageNotFound(f"image {image_id[:12]} is not in the squashed store")
            for other in images:
                if other is not target:
                    other["names"] = [n for n in other.get("names") or [] if n not in names]
            target["names"] = list(target.get("names") or []) + [
                n for n in names if n not in (target.get("names") or [])]
            return self._stored(target)

    def remove(self, ref: str) -> tuple[StoredImage, bool]:
        """Remove a name, or the whole image when it was the last name or ``ref`` is an id.

        Returns the image and whether its data was deleted. Layers still used
        by another squashed image are kept.
        """
        image = self.find(ref)
        if image is None:
            raise ImageNotFound(f"image {ref} is not in the squashed store {self.root}")
        by_id = reference.is_image_id(ref) and image.id.startswith(ref.removeprefix("sha256:"))
        with self._records() as (images, layers):
            record = next(r for r in images if r["id"] == image.id)
            if not by_id:
                matched = next(n for n in reference.candidate_names(ref) if n in (record.get("names") or []))
                record["names"] = [n for n in record["names"] if n != matched]
                if record["names"]:
                    return image, False
            images.remove(record)
            used = self._layers_in_use(images, layers)
            doomed = [layer for layer in layers if layer["id"] not in used]
            layers[:] = [layer for layer in layers if layer["id"] in used]
        # Records are gone: the files are unreachable now, delete them.
        shutil.rmtree(self.root / "overlay-images" / image.id, ignore_errors=True)
        for layer in doomed:
            link = self._link_of(layer["id"])
            if link:
                self.squash_path(link).unlink(missing_ok=True)
                (self.links / link).unlink(missing_ok=True)
            shutil.rmtree(self.root / "overlay" / layer["id"], ignore_errors=True)
            (self.root / "overlay-layers" / f"{layer['id']}.tar-split.gz").unlink(missing_ok=True)
        return image, True

    @staticmethod
    def _layers_in_use(images: list[dict], layers: list[dict]) -> set[str]:
        parents = {layer["id"]: layer.get("parent", "") for layer in layers}
        used: set[str] = set()
        for image in images:
            current = image.get("layer", "")
            while current and current not in used:
                used.add(current)
                current = parents.get(current, "")
        return used

    def remove_stale_temporaries(self, link: str) -> None:
        """Partial squash files of ``link`` left by killed migrations (call under the image lock)."""
        for stale in self.links.glob(f".{link}.squash.*"):
            stale.unlink(missing_ok=True)


def _touch(fd: int) -> None:
    """Write a new last-writer token, as containers/storage's lockfile Touch() does."""
    os.pwrite(fd, secrets.token_hex(32).encode(), 0)


def find_squashed(config, ref: str) -> StoredImage | None:
    """``ref`` in the user's squashed store or one of the site's additional stores."""
    for directory in (config.squash_dir, *config.additional_stores):
        if os.path.isdir(directory):
            found = SquashStore(directory).find(ref)
            if found is not None:
                return found
    return None
