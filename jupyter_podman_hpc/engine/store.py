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

A store whose directory has the setgid bit is a *project store*: its group
shares it. Everything written into it gets the group's read permission
(and write permission when the directory is group-writable, so every
member migrates into it under the same locks), and nothing for others.
A store that exists but cannot be read is refused with one line naming it
and why, before podman sees it (``readable_stores``).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import grp
import json
import os
import pwd
import shutil
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from . import reference
from .errors import ConfigError, EngineError, ImageNotFound, PermissionDenied
from .files import atomic_write


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


@dataclass(frozen=True)
class Sharing:
    """The modes a store's new files and directories get."""

    group: bool = False        # a project store: its group reads it
    group_write: bool = False  # ... and writes it

    @classmethod
    def of(cls, root: Path) -> "Sharing":
        """Read from the store's directory (or, before it exists, from its parent's setgid bit)."""
        for directory in (root, root.parent):
            try:
                mode = directory.stat().st_mode
            except OSError:
                continue
            if not mode & stat.S_ISGID:
                return cls()
            return cls(group=True, group_write=bool(mode & stat.S_IWGRP))
        return cls()

    def file_mode(self) -> int | None:
        """None for a personal store: the user's umask decides, as before."""
        return (0o660 if self.group_write else 0o640) if self.group else None

    def dir_mode(self) -> int | None:
        return (0o2770 if self.group_write else 0o2750) if self.group else None

    def apply(self, path: Path | str) -> None:
        """Give ``path`` (a file or directory we created, never a symlink) the store's mode."""
        mode = self.dir_mode() if os.path.isdir(path) else self.file_mode()
        if mode is not None:
            os.chmod(path, mode)

    def apply_tree(self, top: Path) -> None:
        if not self.group:
            return
        self.apply(top)
        for directory, dirs, files in os.walk(top):
            for name in dirs + files:
                self.apply(os.path.join(directory, name))


def _atomic_write(path: Path, data: bytes, sharing: Sharing = Sharing()) -> None:
    atomic_write(path, data, prepare=sharing.apply)  # the store's files get its group's sharing


def _mkdirs(path: Path, sharing: Sharing) -> None:
    """``mkdir -p`` that gives each directory it creates the store's mode."""
    if path.is_dir():
        return
    _mkdirs(path.parent, sharing)
    try:
        path.mkdir()
    except FileExistsError:
        return
    sharing.apply(path)


_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


@contextlib.contextmanager
def _locked(path: Path, sharing: Sharing = Sharing()) -> Iterator[int]:
    """An exclusive fcntl (POSIX) lock, the kind containers/storage and NFS honour.

    POSIX locks belong to the process, so threads of one process (the
    Jupyter server) also take a per-path thread lock.
    """
    with _thread_locks_guard:
        thread_lock = _thread_locks.setdefault(str(path), threading.Lock())
    with thread_lock:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if sharing.group and os.fstat(fd).st_uid == os.getuid():
                os.fchmod(fd, sharing.file_mode())  # other members lock it too
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
        if not str(root):
            from .config import NO_SQUASH_DIR
            raise ConfigError(NO_SQUASH_DIR)
        self.root = Path(root)
        self.images_json = self.root / "overlay-images" / "images.json"
        self.layers_json = self.root / "overlay-layers" / "layers.json"
        self.links = self.root / "overlay" / "l"
        self.sharing = Sharing.of(self.root)

    # --- layout -------------------------------------------------------------

    def init(self) -> None:
        """Create the store's layout if missing; refuse in one line a store we may not write."""
        self.check_writable()
        try:
            for directory in (self.links, self.images_json.parent, self.layers_json.parent, self.lock_dir):
                _mkdirs(directory, self.sharing)
            for path in (self.images_json, self.layers_json):
                if not path.exists():
                    with _locked(self._lock_file(path), self.sharing):
                        if not path.exists():
                            _atomic_write(path, b"[]", self.sharing)
        except OSError as err:
            raise EngineError(f"cannot create the squashed image store {self.root}: {err.strerror}")

    def check_writable(self) -> None:
        """PermissionDenied, with who may write the store, unless this user may."""
        existing = next((d for d in (self.root, self.root.parent) if d.exists()), None)
        if existing is None or os.access(existing, os.W_OK | os.X_OK):
            inner = [p for p in (self.images_json.parent, self.layers_json.parent, self.links, self.lock_dir)
                     if p.exists() and not os.access(p, os.W_OK | os.X_OK)]
            if not inner:
                return
            existing = inner[0]
        raise PermissionDenied(f"cannot write to the image store {self.root}: {describe_access(existing)}")

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

    def link_of(self, layer: str) -> str:
        """The short link of a layer the store has, else ''."""
        try:
            return (self.root / "overlay" / layer / "link").read_text().strip()
        except OSError:
            return ""

    def _stored(self, record: dict) -> StoredImage:
        squash = self.squash_path(self.link_of(record["layer"])) if record.get("layer") else None
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
        _mkdirs(self.lock_dir, self.sharing)
        with _locked(self.lock_dir / f"{image_id}.lock", self.sharing):
            yield

    @contextlib.contextmanager
    def _records(self) -> Iterator[tuple[list[dict], list[dict]]]:
        """Both record lists, locked as containers/storage locks them; written back on success."""
        with _locked(self._lock_file(self.layers_json), self.sharing) as layers_fd, \
                _locked(self._lock_file(self.images_json), self.sharing) as images_fd:
            images, layers = self._read(self.images_json), self._read(self.layers_json)
            before = (json.dumps(images), json.dumps(layers))
            yield images, layers
            if json.dumps(layers) != before[1]:
                _atomic_write(self.layers_json, json.dumps(layers).encode(), self.sharing)
                _touch(layers_fd)
            if json.dumps(images) != before[0]:
                _atomic_write(self.images_json, json.dumps(images).encode(), self.sharing)
                _touch(images_fd)

    def write_skeleton(self, source: GraphRoot, image_id: str, chain: list[dict]) -> None:
        """Everything but the records and the squash file: big data, tar-splits, layer dirs, links."""
        big_data = self.root / "overlay-images" / image_id
        if not big_data.exists():
            tmp = big_data.with_name(f".{image_id}.{os.uname().nodename}.{os.getpid()}.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(source.big_data(image_id), tmp)
            self.sharing.apply_tree(tmp)  # podman keeps them 0600: other members must read them
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
                _atomic_write(target, split.read_bytes(), self.sharing)
            layer_dir = self.root / "overlay" / layer_id
            _mkdirs(layer_dir / "diff", self.sharing)
            # A layer the store has keeps its link: another image's squash file is named by it
            # (the base image's top layer is a parent of every image built FROM it).
            link = self.link_of(layer_id) or source.link(layer_id)
            if not self.link_of(layer_id):
                _atomic_write(layer_dir / "link", link.encode(), self.sharing)
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
        # Records are gone: the files are unreachable now, delete them. The layer's
        # directory goes before its squash file: an empty layer directory left by a
        # kill would hide the same layer in a later store from podman (upstream #172).
        shutil.rmtree(self.root / "overlay-images" / image.id, ignore_errors=True)
        for layer in doomed:
            link = self.link_of(layer["id"])
            if link:
                (self.links / link).unlink(missing_ok=True)
            shutil.rmtree(self.root / "overlay" / layer["id"], ignore_errors=True)
            if link:
                self.squash_path(link).unlink(missing_ok=True)
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
    os.pwrite(fd, os.urandom(32).hex().encode(), 0)  # secrets.token_hex, without its import cost


def make_store_dir(path: str) -> None:
    """Create a store's directory if missing; in a project directory (setgid) it is shared like it."""
    root = Path(path)
    if not root.is_dir():
        try:
            _mkdirs(root, Sharing.of(root))
        except OSError:
            pass  # podman or the first write says why


def configured_stores(config) -> list[str]:
    """The squashed stores in precedence order: the user's own, then the additional ones."""
    return list(dict.fromkeys(store for store in [config.squash_dir, *config.additional_stores] if store))


def readable_stores(config) -> list[str]:
    """The configured stores that exist, in precedence order; PermissionDenied for one we cannot read.

    A missing store is left out (podman refuses to start with one); one that
    exists but is closed to us is an error naming it and why, instead of
    podman's "open .../images.lock: permission denied" (or silence).
    """
    found = []
    for directory in configured_stores(config):
        root = Path(directory)
        try:
            if not stat.S_ISDIR(root.stat().st_mode):
                continue
        except FileNotFoundError:
            continue
        except PermissionError:
            raise PermissionDenied(_unreadable(root, root))
        needed = [root, root / "overlay-images", root / "overlay-layers", root / "overlay" / "l"]
        needed += [root / "overlay-images" / "images.lock", root / "overlay-layers" / "layers.lock"]
        for path in needed:
            if path.exists() and not os.access(path, os.R_OK | (os.X_OK if path.is_dir() else 0)):
                raise PermissionDenied(_unreadable(root, path))
        private = _private_image_dir(root / "overlay-images")
        if private is not None:  # podman-hpc 1.2.2 copies them 0700 from the user's storage
            raise PermissionDenied(_unreadable(root, private) + f" (its owner can run: chmod -R g+rX {root})")
        found.append(directory)
    return found


def _private_image_dir(images: Path) -> Path | None:
    """An image's directory of big data (manifest, config) this user cannot read, if any."""
    try:
        with os.scandir(images) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False) and not os.access(entry.path, os.R_OK | os.X_OK):
                    return Path(entry.path)
    except OSError:
        pass
    return None


def _unreadable(root: Path, path: Path) -> str:
    return (f"cannot read the image store {root}: {describe_access(path, os.R_OK | os.X_OK)}; "
            "ask for access, or leave it out of the additional stores")


def _name(lookup, number: int) -> str:
    try:
        return lookup(number)[0]
    except KeyError:
        return str(number)


def describe_access(path: Path, want: int = os.W_OK | os.X_OK) -> str:
    """Why this user may not use ``path``: who owns what blocks it, its mode, our relation to it."""
    blocker = next((parent for parent in reversed(path.parents)
                    if parent.exists() and not os.access(parent, os.X_OK)), path)
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


def store_access(directory: str) -> str:
    """What this user may do with a store, for infohpc: "read-write", "read-only, project store
    of group G", "missing", "no access (why)"."""
    root = Path(directory)
    try:
        mode = root.stat().st_mode
    except FileNotFoundError:
        return "missing"
    except OSError:
        return f"no access ({describe_access(root, os.R_OK | os.X_OK)})"
    if not os.access(root, os.R_OK | os.X_OK):
        return f"no access ({describe_access(root, os.R_OK | os.X_OK)})"
    try:
        SquashStore(root).check_writable()
        access = "read-write"
    except PermissionDenied:
        access = "read-only"
    if mode & stat.S_ISGID:
        access += f", project store of group {_name(grp.getgrgid, root.stat().st_gid)}"
    return access


def find_squashed(config, ref: str) -> StoredImage | None:
    """``ref`` in the user's squashed store or one of the additional stores, in that precedence."""
    for directory in readable_stores(config):
        found = SquashStore(directory).find(ref)
        if found is not None:
            return found
    return None


def stored_command(storages: list[str], ref: str) -> tuple[list[str] | None, list[str] | None] | None:
    """The ENTRYPOINT and CMD of the image podman runs for ``ref``, from the storages' own
    records, searched in podman's order (the node-local graph root, then the squashed
    stores); None when that takes podman (a short name, an id, no readable record).

    A shared-run step reads them here instead of running ``podman image inspect``
    beside the node container's start: on a node of few cores that is a second
    podman process competing with the first.
    """
    if reference.is_image_id(ref) or not reference.is_qualified(ref):
        return None  # podman's short-name resolution and id prefixes stay podman's
    names = set(reference.candidate_names(ref))
    for storage in storages:
        images = Path(storage) / "overlay-images"
        try:
            records = json.loads((images / "images.json").read_text() or "[]")
        except (OSError, ValueError):
            continue
        record = next((r for r in records if names & set(r.get("names") or ())), None)
        if record is None:
            continue
        key = base64.b64encode(f"sha256:{record['id']}".encode()).decode()
        try:
            config = json.loads((images / record["id"] / f"={key}").read_text()).get("config") or {}
        except (OSError, ValueError, AttributeError):
            return None
        return config.get("Entrypoint"), config.get("Cmd")
    return None
