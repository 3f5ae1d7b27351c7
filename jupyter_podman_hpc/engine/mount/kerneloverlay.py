"""Kernel overlayfs in podman's user namespace: podman's mount options as kernel overlayfs
options, the mount(2) itself, and the probe ``infohpc`` runs to learn whether this node allows it.

    python -m jupyter_podman_hpc.engine.mount.kerneloverlay RUN_ROOT   (in podman unshare: exit 0 if it mounts)
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Sequence
from pathlib import Path

# Mount options podman (containers/storage) gives its mount program that kernel
# overlayfs takes as they are; any other option (uidmapping=, ...) is fuse-overlayfs's.
KERNEL_OPTIONS = ("lowerdir=", "upperdir=", "workdir=", "volatile")


def kernel_options(options: Sequence[str], lowers: Sequence[str]) -> str | None:
    """The kernel overlayfs option string for podman's mount options, or None if one needs fuse-overlayfs."""
    items = [item for option in options for item in option.split(",") if item]
    if any(not item.startswith(KERNEL_OPTIONS) for item in items):
        return None
    kept = [item for item in items if not item.startswith("lowerdir=")]
    return ",".join([f"lowerdir={':'.join(lowers)}", *kept, "userxattr"])


def mount_overlay(target: str, options: str) -> None:
    """mount(2) a kernel overlayfs; OSError if this node or namespace does not allow it."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"overlay", target.encode(), b"overlay", 0, options.encode()) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def probe_kernel_overlay(scratch: Path) -> str:
    """'' if a kernel overlay mounts here (run inside podman's user namespace), else why not."""
    dirs = {name: scratch / name for name in ("lower", "upper", "work", "merged")}
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    options = f"lowerdir={dirs['lower']},upperdir={dirs['upper']},workdir={dirs['work']},userxattr"
    try:
        mount_overlay(str(dirs["merged"]), options)
    except OSError as err:
        return err.strerror or errno.errorcode.get(err.errno or 0, "?")  # no errno: "?" (0 has no name)
    ctypes.CDLL(None, use_errno=True).umount2(str(dirs["merged"]).encode(), 2)
    return ""


if __name__ == "__main__":  # podman-hpc infohpc runs this inside podman's user namespace
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="overlay-probe-", dir=sys.argv[1]) as scratch:
        reason = probe_kernel_overlay(Path(scratch))
    print(reason)
    sys.exit(1 if reason else 0)
