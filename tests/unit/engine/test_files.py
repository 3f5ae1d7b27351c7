"""One write-temp-then-rename helper for the store, jobs, podman's caches and modules."""

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
