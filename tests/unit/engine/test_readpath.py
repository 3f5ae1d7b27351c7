"""The read path's pieces: settings, kernel overlay options, and the node-local cache of
unpacked copies (with real mksquashfs / unsquashfs)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from jupyter_podman_hpc.engine.config import load_config
from jupyter_podman_hpc.engine.errors import ConfigError
from jupyter_podman_hpc.engine.readpath import (NoRoom, ReadPathSettings, UnpackedCopy, cache_entries,
                                                kernel_options)

needs_squashfs = pytest.mark.skipif(not (shutil.which("mksquashfs") and shutil.which("unsquashfs")),
                                    reason="squashfs-tools are not installed")


def test_podman_options_become_kernel_overlay_options_with_userxattr():
    options = ["lowerdir=l/A:l/B,upperdir=/g/x/diff,workdir=/g/x/work,,volatile"]
    assert kernel_options(options, ["/c/a", "/c/b"]) == \
        "lowerdir=/c/a:/c/b,upperdir=/g/x/diff,workdir=/g/x/work,volatile,userxattr"


def test_an_option_only_fuse_overlayfs_has_keeps_fuse_overlayfs():
    assert kernel_options(["lowerdir=l/A,upperdir=u,workdir=w,uidmapping=0:1000:1"], ["/c/a"]) is None


def test_settings_travel_to_the_mount_program_through_podmans_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PODMANHPC_CONFIG_FILE", str(tmp_path / "none.yaml"))
    (tmp_path / "none.yaml").write_text("squash_read_path: kernel\nsquash_unpack_max_mb: 512\n")
    config = load_config()
    settings = ReadPathSettings.from_env(config.podman_env({}))
    assert settings == ReadPathSettings("kernel", f"/dev/shm/{os.getuid()}_hpc/unpacked", 512.0)
    assert settings.kernel_overlay and not settings.unpacks
    assert ReadPathSettings.from_env({}).mode == "auto"


def test_an_unknown_read_path_is_a_one_line_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PODMANHPC_SQUASH_READ_PATH", "fastest")
    with pytest.raises(ConfigError, match="squash_read_path .* must be one of auto, unpacked, kernel, fuse"):
        load_config()


def _squash(tmp_path: Path, name: str, size: int = 1000) -> Path:
    tree = tmp_path / f"{name}-tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "hello").write_text(name)
    (tree / "blob").write_bytes(os.urandom(size))
    target = tmp_path / f"{name}.squash"
    subprocess.run(["mksquashfs", str(tree), str(target), "-comp", "lz4", "-quiet", "-no-progress"],
                   check=True, stdout=subprocess.DEVNULL)
    return target


@needs_squashfs
def test_a_copy_is_unpacked_once_and_shared(tmp_path):
    squash = _squash(tmp_path, "one")
    first, second = (UnpackedCopy(squash, tmp_path / "cache", 2**30) for _ in range(2))
    root = first.acquire()
    assert (root / "etc" / "hello").read_text() == "one"
    inode = root.stat().st_ino
    assert second.acquire().stat().st_ino == inode  # not unpacked again
    first.release()
    second.release()
    assert [key for key, size, _ in cache_entries(tmp_path / "cache")] == [first.key]
    assert cache_entries(tmp_path / "cache")[0][1] > 1000  # its size is recorded


@needs_squashfs
def test_unused_copies_are_evicted_oldest_first_and_used_ones_never(tmp_path):
    cache = tmp_path / "cache"
    squashes = [_squash(tmp_path, name, 200_000) for name in ("a", "b", "c")]
    budget = squashes[0].stat().st_size * 3 * 3 // 2  # room for one estimate and one copy
    held = UnpackedCopy(squashes[0], cache, budget)
    held.acquire()
    old = UnpackedCopy(squashes[1], cache, budget)
    old.acquire()
    old.release()
    new = UnpackedCopy(squashes[2], cache, budget)
    new.acquire()
    keys = {key for key, _, _ in cache_entries(cache)}
    assert keys == {held.key, new.key}  # b, unused, made room; a, in use, stayed
    assert (held.root / "etc" / "hello").read_text() == "a"
    new.release()
    held.release()


@needs_squashfs
def test_no_room_is_refused_so_the_caller_falls_back(tmp_path):
    squash = _squash(tmp_path, "big", 300_000)
    with pytest.raises(NoRoom, match="squash_unpack_max_mb"):
        UnpackedCopy(squash, tmp_path / "cache", 1000).acquire()
    budget = squash.stat().st_size * 3 + 1024
    held = UnpackedCopy(squash, tmp_path / "cache", budget)
    held.acquire()
    other = _squash(tmp_path, "other", 300_000)
    with pytest.raises(NoRoom, match="in use by other images"):
        UnpackedCopy(other, tmp_path / "cache", budget).acquire()
    held.release()


@needs_squashfs
def test_a_killed_unpack_leaves_nothing_that_the_next_one_keeps(tmp_path):
    squash = _squash(tmp_path, "one")
    cache = tmp_path / "cache"
    (cache / "0123.tmp-99999" / "half").mkdir(parents=True)
    copy = UnpackedCopy(squash, cache, 2**30)
    copy.acquire()
    assert not list(cache.glob("*.tmp-*"))
    copy.release()
