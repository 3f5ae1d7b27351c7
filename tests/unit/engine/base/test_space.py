"""A file system's room, by path and by open file."""

import os

from jupyter_podman_hpc.engine.base import space


def test_free_bytes_by_path_and_by_open_file(tmp_path):
    by_path = space.free_bytes(tmp_path)
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        by_fd = space.free_bytes(fd)
    finally:
        os.close(fd)
    assert by_path is not None and by_fd is not None and by_path > 0
    assert abs(by_path - by_fd) < 64 << 20  # the same file system, looked at twice
    assert space.free_bytes(tmp_path / "missing") is None


def test_full_is_less_than_the_threshold_left(tmp_path, monkeypatch):
    assert not space.looks_full(tmp_path / "missing")  # unknown is not full
    monkeypatch.setattr(space, "free_bytes", lambda path: space.FULL_BELOW - 1)
    assert space.looks_full(tmp_path)
    monkeypatch.setattr(space, "free_bytes", lambda path: space.FULL_BELOW)
    assert not space.looks_full(tmp_path)
