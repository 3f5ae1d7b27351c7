"""Helpers of the engine's unit tests: squash files made with the real mksquashfs, and
copies of them unpacked into a cache (engine/mount/unpack.py, engine/mount/cache.py); images
squashed into a store as migrate leaves them (engine/store/squashed.py, engine/store/remove.py); what a
sweep of killed monitors or tasks removes (engine/run/stepmonitor.py, engine/run/perprocess.py)."""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from jupyter_podman_hpc.engine.site.readpath import ReadPathSettings
from jupyter_podman_hpc.engine.mount.unpack import UnpackedCopy

needs_squashfs = pytest.mark.skipif(not (shutil.which("mksquashfs") and shutil.which("unsquashfs")),
                                    reason="squashfs-tools are not installed")


def squash_file(tmp_path: Path, name: str, size: int = 1000) -> Path:
    tree = tmp_path / f"{name}-tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "hello").write_text(name)
    (tree / "blob").write_bytes(os.urandom(size))
    target = tmp_path / f"{name}.squash"
    subprocess.run(["mksquashfs", str(tree), str(target), "-comp", "lz4", "-quiet", "-no-progress"],
                   check=True, stdout=subprocess.DEVNULL)
    return target


def made_copy(tmp_path: Path, name: str, job: str = "", cache: str = "cache") -> UnpackedCopy:
    copy = UnpackedCopy(squash_file(tmp_path, name), tmp_path / cache, 2**30,
                        settings=ReadPathSettings("auto", str(tmp_path / cache), 1024, 30.0, job))
    copy.acquire()
    return copy


def age(copy: UnpackedCopy, minutes: float) -> None:
    then = time.time() - minutes * 60
    os.utime(copy.ref_path, (then, then))


LINK = "HH27KLVLMHONA4FWTLH3LL54FO"


def squashed_image(store, image_id, layer, link, names):
    """An image as migrate leaves it in the store: big data, layer skeleton, link, squash file, records."""
    (store.root / "overlay-images" / image_id).mkdir()
    (store.root / "overlay-images" / image_id / "manifest").write_text("{}")
    (store.root / "overlay" / layer / "diff").mkdir(parents=True)
    (store.root / "overlay" / layer / "link").write_text(link)
    (store.links / link).symlink_to(f"../{layer}/diff")
    (store.links / f"{link}.squash").write_bytes(b"hsqs" + os.urandom(1000))
    for path, record in ((store.images_json, {"id": image_id, "layer": layer, "names": names}),
                         (store.layers_json, {"id": layer})):
        path.write_text(json.dumps(json.loads(path.read_text()) + [record]))


class RemovalsPodman:
    """Stands in for Podman in a sweep: records the containers removed and the conmons killed."""

    def __init__(self) -> None:
        self.removed: list[str] = []
        self.killed: list[str] = []

    def remove_containers(self, *names: str) -> None:
        self.removed += names


@pytest.fixture
def removals(monkeypatch) -> RemovalsPodman:
    from jupyter_podman_hpc.engine.base import processes

    podman = RemovalsPodman()
    monkeypatch.setattr(processes, "kill_conmon", podman.killed.append)
    return podman
