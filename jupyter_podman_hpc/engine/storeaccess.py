"""Which squashed stores apply to this user, and what the user may do with each.

The user's own store comes first, then the additional (project or site)
stores in the configured order (``configured_stores``). A store that is
missing is left out; one that exists but is closed to this user is refused
with one line naming it and why, before podman sees it (``readable_stores``).
A project store is a store whose directory has the setgid bit: its group
shares it (the modes its files get are ``sharing.Sharing``'s). The on-disk
format of a store is ``engine.store``'s.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import EngineError, PermissionDenied
from .private import describe_access, group_name
from .sharing import Sharing
from .store import SquashStore, StoredImage
from .storefs import make_dirs


def make_store_dir(path: str) -> None:
    """Create a store's directory if missing; in a project directory (setgid) it is shared like it."""
    root = Path(path)
    if not root.is_dir():
        try:
            make_dirs(root, Sharing.of(root).dir_mode())
        except (OSError, EngineError):
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
        access += f", project store of group {group_name(root.stat().st_gid)}"
    return access


def find_squashed(config, ref: str) -> StoredImage | None:
    """``ref`` in the user's squashed store or one of the additional stores, in that precedence."""
    for directory in readable_stores(config):
        found = SquashStore(directory).find(ref)
        if found is not None:
            return found
    return None


__all__ = ["configured_stores", "find_squashed", "make_store_dir", "readable_stores", "store_access"]
