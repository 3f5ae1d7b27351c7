"""The squash file's digest: checked against its record once per file identity on a node."""

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from jupyter_podman_hpc.engine.store import squashcheck
from jupyter_podman_hpc.engine.store.records import SQUASH_DIGEST
from jupyter_podman_hpc.engine.store.squashcheck import (
    SquashChanged,
    SquashDamaged,
    VerifiedFiles,
    check,
    recorded,
    verified_dir,
)

LAYER = "2108b300847846c93247b62e64e43dee44ad29772604f104a14cdcdd515c3b1c"


@pytest.fixture
def squash(tmp_path):
    path = tmp_path / "HH27KLVLMHONA4FWTLH3LL54FO.squash"
    data = bytearray(b"hsqs" + os.urandom(3 * 2**20))
    data[40:48] = len(data).to_bytes(8, "little")  # the superblock's bytes_used: a whole image
    path.write_bytes(bytes(data))
    return path


@pytest.fixture
def reads(monkeypatch):
    """How many times a whole file was read to hash it."""
    count = []
    real = squashcheck.sha256_of

    def counting(fd):
        count.append(fd)
        return real(fd)

    monkeypatch.setattr(squashcheck, "sha256_of", counting)
    return count


def digest_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_file_is_read_once_per_identity_then_remembered(tmp_path, squash, reads):
    verified = VerifiedFiles(tmp_path / "verified")
    (tmp_path / "verified").mkdir(mode=0o700)
    for _ in range(3):  # three container starts on the node
        fd = os.open(squash, os.O_RDONLY)
        try:
            assert check(fd, squash, {digest_of(squash)}, verified)
        finally:
            os.close(fd)
    assert len(reads) == 1
    assert len(os.listdir(tmp_path / "verified")) == 1


def test_a_file_written_to_after_its_check_is_read_again_and_refused(tmp_path, squash, reads):
    (tmp_path / "verified").mkdir(mode=0o700)
    verified = VerifiedFiles(tmp_path / "verified")
    good = digest_of(squash)
    fd = os.open(squash, os.O_RDONLY)
    try:
        assert check(fd, squash, {good}, verified)
        time.sleep(0.01)  # later than the squash, as any rewrite is
        with open(squash, "r+b") as out:  # a member rewrites a block in place, size kept
            out.seek(2**20)
            out.write(b"X" * 4096)
        with pytest.raises(SquashChanged) as refused:
            check(fd, squash, {good}, verified)
    finally:
        os.close(fd)
    assert str(refused.value) == (
        f"squash file {squash} does not match its record: it was changed after it was squashed; squash the image again"
    )
    assert len(reads) == 2


def test_images_without_a_digest_run_unchecked(tmp_path, squash, reads):
    fd = os.open(squash, os.O_RDONLY)
    try:
        assert check(fd, squash, set(), VerifiedFiles(tmp_path)) is False
    finally:
        os.close(fd)
    assert reads == []


def test_what_the_store_records_for_a_layer(tmp_path):
    images = tmp_path / "overlay-images"
    images.mkdir()
    (images / "images.json").write_text(
        json.dumps(
            [
                {"id": "a" * 64, "layer": LAYER, "flags": {SQUASH_DIGEST: "sha256:" + "d" * 64}},
                {"id": "b" * 64, "layer": LAYER},  # podman-hpc 1.2.2's
                {"id": "../x", "layer": "c" * 64, "flags": {SQUASH_DIGEST: "sha256:" + "e" * 64}},
            ]
        )
    )
    assert recorded(tmp_path, LAYER) == (True, {"d" * 64})
    assert recorded(tmp_path, "c" * 64) == (False, set())  # an invalid record vouches for nothing
    assert recorded(tmp_path / "missing", LAYER) == (False, set())


def test_the_node_remembers_beside_its_unpacked_copies_in_a_directory_of_the_users(tmp_path):
    own = tmp_path / "1001_hpc"
    own.mkdir(mode=0o700)
    assert verified_dir(f"{own}/unpacked", "/tmp/1001_hpc/storage") == own / "squash-verified"
    # a site template whose parent is everyone's (/dev/shm): in the user's own unpack directory
    shared = tmp_path / "shm"
    shared.mkdir()
    shared.chmod(0o1777)
    assert verified_dir(f"{shared}/unpacked-1001", "/tmp/1001_hpc/storage") == shared / "unpacked-1001/squash-verified"
    assert verified_dir("/dev/shm/unpacked-1001", "/g") == Path("/dev/shm/unpacked-1001/squash-verified")
    assert verified_dir("", "/tmp/1001_hpc/storage") == Path("/tmp/1001_hpc/storage/squash-verified")


@pytest.mark.parametrize(
    "cut, why",
    [
        (2**20, f"it is truncated ({2**20} of its {3 * 2**20 + 4} bytes)"),
        (0, "it is empty"),
    ],
)
def test_a_truncated_squash_file_is_refused_as_such_before_its_digest_is_read(tmp_path, squash, reads, cut, why):
    good = digest_of(squash)
    os.truncate(squash, cut)  # a copy that stopped, a full file system
    fd = os.open(squash, os.O_RDONLY)
    try:
        with pytest.raises(SquashDamaged) as refused:
            check(fd, squash, {good}, VerifiedFiles(tmp_path))
    finally:
        os.close(fd)
    assert str(refused.value) == (
        f"squash file {squash} is damaged: {why}; squash the image again (podman-hpc pull or migrate)"
    )
    assert reads == []


def test_a_file_that_is_no_squashfs_image_is_refused_without_a_digest_too(tmp_path, squash):
    squash.write_bytes(b"<html>not found</html>")
    fd = os.open(squash, os.O_RDONLY)
    try:
        with pytest.raises(SquashDamaged, match="it is not a squashfs image"):
            check(fd, squash, set(), VerifiedFiles(tmp_path))
    finally:
        os.close(fd)
