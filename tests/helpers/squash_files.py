"""Squash files made with the real mksquashfs, and copies of them unpacked into a cache
(engine/mount/unpack.py, engine/mount/cache.py)."""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from jupyter_podman_hpc.engine.mount.unpack import UnpackedCopy
from jupyter_podman_hpc.engine.site.readpath import ReadPathSettings

needs_squashfs = pytest.mark.skipif(
    not (shutil.which("mksquashfs") and shutil.which("unsquashfs")), reason="squashfs-tools are not installed"
)


def squash_file(tmp_path: Path, name: str, size: int = 1000) -> Path:
    tree = tmp_path / f"{name}-tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "hello").write_text(name)
    (tree / "blob").write_bytes(os.urandom(size))
    target = tmp_path / f"{name}.squash"
    subprocess.run(
        ["mksquashfs", str(tree), str(target), "-comp", "lz4", "-quiet", "-no-progress"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return target


def made_copy(tmp_path: Path, name: str, job: str = "", cache: str = "cache") -> UnpackedCopy:
    copy = UnpackedCopy(
        squash_file(tmp_path, name),
        tmp_path / cache,
        2**30,
        settings=ReadPathSettings("auto", str(tmp_path / cache), 1024, 30.0, job),
    )
    copy.acquire()
    return copy


def age(copy: UnpackedCopy, minutes: float) -> None:
    then = time.time() - minutes * 60
    os.utime(copy.ref_path, (then, then))
