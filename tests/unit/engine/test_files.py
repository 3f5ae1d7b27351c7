"""One write-temp-then-rename helper for the store, jobs, podman's caches and modules."""

import os

import pytest

from jupyter_podman_hpc.engine.files import atomic_write


def test_the_new_content_replaces_the_old_whole(tmp_path):
    path = tmp_path / "images.json"
    path.write_text("old")
    seen = []
    atomic_write(path, '["new"]', 0o640, prepare=lambda tmp: seen.append((tmp.parent, tmp.read_text())))
    assert path.read_text() == '["new"]' and path.stat().st_mode & 0o777 == 0o640
    assert seen == [(tmp_path, '["new"]')] and os.listdir(tmp_path) == ["images.json"]


def test_a_failed_write_leaves_the_file_and_no_temporary(tmp_path):
    path = tmp_path / "job.json"
    path.write_bytes(b"old")

    def refuse(tmp):
        raise PermissionError("chgrp refused")
    with pytest.raises(PermissionError):
        atomic_write(path, b"new", prepare=refuse)
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["job.json"]
