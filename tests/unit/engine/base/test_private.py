"""Per-user state directories: made 0700, refused when another user could have planted them."""

import os
import stat

import pytest

from jupyter_podman_hpc.engine.base import private
from jupyter_podman_hpc.engine.base.private import UnsafeDirectory, own_dir, private_dir, trusted_dir


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_missing_directory_and_its_parents_are_made_private(tmp_path):
    path = private_dir(tmp_path / "a" / "b")
    assert path == tmp_path / "a" / "b"
    assert mode(path) == 0o700 and mode(path.parent) == 0o700


def test_an_own_directory_nobody_else_could_write_is_tightened(tmp_path):
    (tmp_path / "old").mkdir(mode=0o755)
    os.chmod(tmp_path / "old", 0o755)
    private_dir(tmp_path / "old")
    assert mode(tmp_path / "old") == 0o700


def test_an_own_directory_others_could_write_is_refused_and_left_alone(tmp_path):
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o777)
    with pytest.raises(UnsafeDirectory, match=r"open is \S+:\S+ drwxrwxrwx: others may have written"):
        private_dir(tmp_path / "open")
    assert mode(tmp_path / "open") == 0o777


def test_a_symlink_is_refused(tmp_path):
    (tmp_path / "target").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(UnsafeDirectory, match="is a symbolic link"):
        private_dir(tmp_path / "link" / "state")
    assert not (tmp_path / "target" / "state").exists()


def test_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UnsafeDirectory, match="not a directory"):
        private_dir(tmp_path / "file")


def test_below_a_sticky_shared_directory_everything_must_be_the_users(tmp_path, monkeypatch):
    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    (shared / "planted" / "config").mkdir(parents=True)
    private_dir(shared / "mine" / "config")  # made by the user: fine
    # another user made "planted" (this test cannot chown: it shows the owner as someone else's)
    real = private._make_or_lstat

    def owned_by_someone_else(path):
        st = real(path)
        if path.name != "planted":
            return st
        fields = list(st[:10])
        fields[4] = os.getuid() + 4242
        return os.stat_result(fields)

    monkeypatch.setattr(private, "_make_or_lstat", owned_by_someone_else)
    with pytest.raises(UnsafeDirectory, match=r"planted is \S+:\S+ drwx\S+: it belongs to another user"):
        private_dir(shared / "planted" / "config")


def test_a_parent_another_user_owns_below_a_sticky_directory_is_refused(tmp_path, monkeypatch):
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o777)
    real = private._make_or_lstat

    def owned_by_someone_else(path):
        st = real(path)
        fields = list(st[:10])
        if path.name == "open":
            fields[4] = 0  # root's (tmp_path lies below the sticky /tmp: even root's is not trusted)
        return os.stat_result(fields)

    monkeypatch.setattr(private, "_make_or_lstat", owned_by_someone_else)
    with pytest.raises(UnsafeDirectory, match=r"open is root:.* drwxrwxrwx: it belongs to another user"):
        private_dir(tmp_path / "open" / "state")
    assert not (tmp_path / "open" / "state").exists()


def test_own_dir_judges_only_the_directory(tmp_path):
    assert mode(own_dir(tmp_path / "state")) == 0o700
    os.chmod(tmp_path / "state", 0o770)
    with pytest.raises(UnsafeDirectory, match="others may have written"):
        own_dir(tmp_path / "state")


def test_trusted_dir_accepts_a_directory_nobody_else_writes(tmp_path):
    (tmp_path / "hooks").mkdir(mode=0o755)
    assert trusted_dir(tmp_path / "hooks") == tmp_path / "hooks"
    os.chmod(tmp_path / "hooks", 0o777)
    with pytest.raises(UnsafeDirectory, match="others may write into it"):
        trusted_dir(tmp_path / "hooks")


def test_the_refusal_is_the_engines_one_line_error_with_exit_125(tmp_path):
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o777)
    with pytest.raises(UnsafeDirectory) as caught:
        private_dir(tmp_path / "open")
    assert caught.value.exit_code == 125 and "\n" not in str(caught.value)
