"""slurmdbd's database password (dev/stacklib/slurm.py ``_db_password``): created 0600, never wider for a
moment. The file gets its mode when it is created, so the test forbids every chmod and sets the umask to 0:
a file written at the umask's mode and narrowed afterwards (what the stack did) fails."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "dev"))

from stacklib import layout, slurm


@pytest.fixture
def mariadb_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(layout, "MARIADB_DIR", tmp_path / "mariadb")
    previous = os.umask(0)
    try:
        yield tmp_path / "mariadb"
    finally:
        os.umask(previous)


def _no_chmod(*args, **kwargs):
    raise AssertionError("the password file's mode is changed after it was created")


def test_the_password_file_is_created_0600(mariadb_dir, monkeypatch):
    monkeypatch.setattr(os, "chmod", _no_chmod)
    monkeypatch.setattr(os, "fchmod", _no_chmod)
    monkeypatch.setattr(Path, "chmod", _no_chmod)
    password = slurm._db_password()
    path = mariadb_dir / "slurm.password"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == password and len(password) == 32
    assert sorted(p.name for p in mariadb_dir.iterdir()) == ["slurm.password"]


def test_it_is_made_once(mariadb_dir):
    assert slurm._db_password() == slurm._db_password()


def test_a_temporary_file_a_killed_start_left_is_replaced(mariadb_dir):
    mariadb_dir.mkdir()
    (mariadb_dir / "slurm.tmp").write_text("half")
    password = slurm._db_password()
    assert password != "half" and stat.S_IMODE((mariadb_dir / "slurm.password").stat().st_mode) == 0o600
    assert not (mariadb_dir / "slurm.tmp").exists()
