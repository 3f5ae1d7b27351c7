"""Which squashed stores apply to this user, and what the user may do with each.

The user's own store comes first, then the additional (project or site)
stores in the configured order (``configured_stores``). A store that is
missing is left out; one that exists but is closed to this user is refused
with one line naming it and why, before podman sees it (``readable_stores``).
A write the user may not make is refused the same way before anything is
written (``check_writable``), and so is a removal that another member's file
in a sticky project store stands in the way of (``check_removable``).
A project store is a store whose directory has the setgid bit: its group
shares it (the modes its files get are ``sharing.Sharing``'s). The on-disk
format of a store is ``engine.store.squashed``'s.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from ..base.private import describe, describe_access, group_name, user_name
from ..errors import ConfigError, EngineError, PermissionDenied
from .fs import Tree, make_dirs
from .sharing import Sharing


def store_root(directory: str | Path) -> Path:
    """The root of the squashed store ``directory``; ConfigError when there is none (no SCRATCH)."""
    if not str(directory):
        from ..site.config import NO_SQUASH_DIR

        raise ConfigError(NO_SQUASH_DIR)
    return Path(directory)


def _record_dirs(root: Path) -> list[Path]:
    """The directories every reader and writer of the store ``root`` enters."""
    return [root / "overlay-images", root / "overlay-layers", root / "overlay" / "l"]


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
        needed = [root, *_record_dirs(root)]
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
    return (
        f"cannot read the image store {root}: {describe_access(path, os.R_OK | os.X_OK)}; "
        "ask for access, or leave it out of the additional stores"
    )


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
        check_writable(root)
        access = "read-write"
    except PermissionDenied:
        access = "read-only"
    if mode & stat.S_ISGID:
        access += f", project store of group {group_name(root.stat().st_gid)}"
    return access


def check_writable(directory: str | Path) -> None:
    """PermissionDenied, with who may write the store ``directory``, unless this user may."""
    root = store_root(directory)
    existing = next((d for d in (root, root.parent) if d.exists()), None)
    if existing is None or os.access(existing, os.W_OK | os.X_OK):
        inner = [
            p for p in [*_record_dirs(root), root / ".locks"] if p.exists() and not os.access(p, os.W_OK | os.X_OK)
        ]
        if not inner:
            return
        existing = inner[0]
    raise PermissionDenied(f"cannot write to the image store {root}: {describe_access(existing)}")


def check_removable(tree: Tree, image_id: str, entries: Iterable[tuple[tuple[str, ...], str]]) -> None:
    """PermissionDenied if a sticky directory of the store ``tree`` keeps this user from removing
    one of ``entries`` (parts, name) of the image ``image_id``: in a project store only a file's
    owner (or its directory's) may remove it."""
    me = os.getuid()
    for parts, name in entries:
        st = tree.lstat(parts, name)
        if st is None or st.st_uid == me or me == 0:
            continue
        with tree.directory(parts) as dirfd:
            parent = os.fstat(dirfd)
        if parent.st_mode & stat.S_ISVTX and parent.st_uid != me:
            path = tree.path(parts, name)
            raise PermissionDenied(
                f"cannot remove {image_id[:12]} from the image store {tree.root}: {describe(path, st)}, "
                f"and in this project store only a file's owner (or the owner of {path.parent}) may "
                f"remove it; ask {user_name(st.st_uid)} to run podman-hpc rmsqi"
            )


__all__ = [
    "check_removable",
    "check_writable",
    "configured_stores",
    "make_store_dir",
    "readable_stores",
    "store_access",
    "store_root",
]
