"""The mount program's choice of squash file, and its refusal of one that is not its record's
(before any mount or unpack)."""

import hashlib
import json
import os

import pytest

from jupyter_podman_hpc.engine import mount
from jupyter_podman_hpc.engine.records import SQUASH_DIGEST

LAYER = "2108b300847846c93247b62e64e43dee44ad29772604f104a14cdcdd515c3b1c"
LINK = "HH27KLVLMHONA4FWTLH3LL54FO"


def store_with(root, digest="", record=True):
    """A store holding one squashed image (its squash file arbitrary bytes) of LAYER."""
    (root / "overlay" / LAYER / "diff").mkdir(parents=True)
    (root / "overlay" / "l").mkdir()
    (root / "overlay" / "l" / LINK).symlink_to(f"../{LAYER}/diff")
    squash = root / "overlay" / "l" / f"{LINK}.squash"
    squash.write_bytes(b"hsqs" + os.urandom(4096))
    (root / "overlay-images").mkdir()
    image = {"id": "a" * 64, "layer": LAYER, "names": ["localhost/x:1"]}
    if digest:
        image["flags"] = {SQUASH_DIGEST: f"sha256:{digest}"}
    (root / "overlay-images" / "images.json").write_text(json.dumps([image] if record else []))
    return root / "overlay" / "l" / LINK, squash


def test_a_squash_file_its_store_records_is_used_with_its_digests(tmp_path):
    lower, squash = store_with(tmp_path / "store", "d" * 64)
    assert mount.squash_of(lower) == (squash, lower, {"d" * 64})


def test_a_squash_file_no_record_vouches_for_is_not_used(tmp_path):
    lower, _ = store_with(tmp_path / "store", record=False)
    assert mount.squash_of(lower) is None


def test_a_short_link_pointing_out_of_its_store_is_not_followed(tmp_path):
    lower, _ = store_with(tmp_path / "store", "d" * 64)
    lower.unlink()
    lower.symlink_to(tmp_path)  # planted: a directory of the user's
    assert mount.squash_of(lower) is None


def test_a_changed_squash_file_is_refused_in_one_line_before_anything_is_mounted(tmp_path, monkeypatch, capsys):
    lower, squash = store_with(tmp_path / "store")
    digest = hashlib.sha256(squash.read_bytes()).hexdigest()
    images = tmp_path / "store" / "overlay-images" / "images.json"
    records = json.loads(images.read_text())
    records[0]["flags"] = {SQUASH_DIGEST: f"sha256:{digest}"}
    images.write_text(json.dumps(records))
    with open(squash, "r+b") as out:  # rewritten after it was squashed
        out.seek(100)
        out.write(b"evil")
    layer = tmp_path / "graph" / "overlay" / ("c" * 64)
    for name in ("diff", "work", "merged"):
        (layer / name).mkdir(parents=True)
    (tmp_path / "shm" / "unpacked").mkdir(parents=True, mode=0o700)  # podman-hpc made it (prepare_state)
    monkeypatch.setenv("PODMANHPC_SQUASH_UNPACK_DIR", str(tmp_path / "shm" / "unpacked"))
    ran = []
    monkeypatch.setattr(mount.commands, "run", lambda argv, **kw: ran.append(argv))
    code = mount.main(["-o", f"lowerdir={lower},upperdir={layer}/diff,workdir={layer}/work", str(layer / "merged")])
    err = capsys.readouterr().err
    assert code == 1 and ran == []  # no unsquashfs, no squashfuse, no fuse-overlayfs
    assert err == (f"podman-hpc-mount: squash file {squash} does not match its record: it was changed after "
                   "it was squashed; squash the image again")  # no newline: podman puts it in one line
    assert os.listdir(tmp_path / "shm" / "unpacked") == []
