"""The user's own small files: one write-temp-then-rename helper (store, jobs, podman's caches,
modules) and one trusted read (task and service records)."""

import os

import pytest

from jupyter_podman_hpc.engine import files
from jupyter_podman_hpc.engine.files import atomic_write


def test_the_new_content_replaces_the_old_whole(tmp_path):
    path = tmp_path / "images.json"
    path.write_text("old")
    atomic_write(path, '["new"]', 0o640)
    assert path.read_text() == '["new"]' and path.stat().st_mode & 0o777 == 0o640
    assert os.listdir(tmp_path) == ["images.json"]


def test_a_name_in_a_directory_descriptor_is_written_there(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        atomic_write("layers.json", b"[]", 0o660, dir_fd=fd)
    finally:
        os.close(fd)
    assert (tmp_path / "layers.json").read_bytes() == b"[]"
    assert (tmp_path / "layers.json").stat().st_mode & 0o777 == 0o660


def test_a_failed_write_leaves_the_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "job.json"
    path.write_bytes(b"old")

    def refuse(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(files.os, "fsync", refuse)
    with pytest.raises(OSError):
        atomic_write(path, b"new")
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["job.json"]


def test_a_link_planted_under_the_temporary_name_is_not_followed(tmp_path, monkeypatch):
    """In a directory another user can write, the temporary name must not lead to their choice
    of file: the write fails instead of writing (or chmod-ing) through the link."""
    victim = tmp_path / "id_ed25519"
    victim.write_text("private")
    victim.chmod(0o600)
    monkeypatch.setattr(files.os, "urandom", lambda n: b"\0" * n)
    planted = tmp_path / f".images.json.{os.uname().nodename}.{os.getpid()}.000000.tmp"
    planted.symlink_to(victim)
    with pytest.raises(FileExistsError):
        atomic_write(tmp_path / "images.json", b"[]", 0o660)
    assert victim.read_text() == "private" and victim.stat().st_mode & 0o777 == 0o600
    assert planted.is_symlink() and not (tmp_path / "images.json").exists()


def test_only_the_users_own_unshared_json_is_read_back(tmp_path):
    good = tmp_path / "task.json"
    atomic_write(good, '{"id": "a"}', 0o600)
    assert files.read_own_json(good) == {"id": "a"}
    link = tmp_path / "link.json"
    link.symlink_to(good)
    writable = tmp_path / "writable.json"
    atomic_write(writable, '{"id": "b"}', 0o622)  # another user could have rewritten it
    big = tmp_path / "big.json"
    atomic_write(big, '["' + "x" * 100 + '"]', 0o600)
    broken = tmp_path / "broken.json"
    atomic_write(broken, '{"id": ', 0o600)
    assert [files.read_own_json(path, limit=64) for path in (link, writable, big, broken, tmp_path / "none")] \
        == [None] * 5
