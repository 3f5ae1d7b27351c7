"""The user's own small files: one write-temp-then-rename helper (store, jobs, podman's caches,
modules) and one trusted read (task and service records); and the files a container could have
written (a job's logs and outputs), read as data: never through a link, never waiting on a FIFO,
bounded."""

import os

import pytest

from jupyter_podman_hpc.engine.base import files
from jupyter_podman_hpc.engine.base.files import atomic_write


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
    assert [files.read_own_json(path, limit=64) for path in (link, writable, big, broken, tmp_path / "none")] == [
        None
    ] * 5


@pytest.fixture
def planted(tmp_path):
    """What code in an image leaves where the host reads its output: a link to /dev/zero, a FIFO
    nobody writes, a link to a file of the user's, a directory in a file's place."""
    (tmp_path / "zero.out").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo.out")
    secret = tmp_path / "secret"
    secret.write_text("the user's")
    (tmp_path / "secret.out").symlink_to(secret)
    (tmp_path / "dir.out").mkdir()
    return tmp_path


def test_an_untrusted_file_is_read_only_when_it_is_a_regular_file_within_its_limit(planted):
    (planted / "rank-0.out").write_bytes(b"x" * 100)
    assert files.read_untrusted(planted / "rank-0.out", 100) == b"x" * 100
    with pytest.raises(files.UntrustedFile, match=r"^rank-0.out is 101 B, over the 100 B read$") as over:
        (planted / "rank-0.out").write_bytes(b"x" * 101)
        files.read_untrusted(planted / "rank-0.out", 100)
    assert over.value.size == 101
    for name, why in (
        ("zero.out", "is a symbolic link"),
        ("fifo.out", "is not a regular file"),
        ("secret.out", "is a symbolic link"),
        ("dir.out", "is not a regular file"),
    ):
        with pytest.raises(files.UntrustedFile, match=f"^{name} {why}: not read$"):
            files.read_untrusted(planted / name, 1 << 20)
    with pytest.raises(FileNotFoundError):
        files.read_untrusted(planted / "missing.out", 100)


def test_below_a_trusted_directory_no_link_is_followed_on_the_way(tmp_path):
    home = tmp_path / "home"
    (home / "nbrun").mkdir(parents=True)
    (home / "nbrun" / "progress.json").write_text("{}")
    job = tmp_path / "job"
    (job / "out").mkdir(parents=True)
    (job / "out" / "nbrun").symlink_to(home / "nbrun")
    path = job / "out" / "nbrun" / "progress.json"
    assert files.read_untrusted(path, 100) == b"{}"  # only the last name is not followed...
    with pytest.raises(files.UntrustedFile, match=r"^nbrun is a symbolic link or not a directory: not read$"):
        files.read_untrusted(path, 100, beneath=job)  # ...unless the caller names the host's directory
    (job / "out" / "nbrun").unlink()
    (job / "out" / "nbrun").mkdir()
    (job / "out" / "nbrun" / "progress.json").write_text("[]")
    assert files.read_untrusted(path, 100, beneath=job) == b"[]"


def test_a_log_keeps_its_end_and_a_planted_one_is_one_line(planted):
    (planted / "rank-0.out").write_text("a" * 50 + "\nthe end\n")
    assert files.read_untrusted_log(planted / "rank-0.out", 100) == "a" * 50 + "\nthe end\n"
    (planted / "rank-1.out").write_bytes(b"a pty's line\r\nan old Mac's\r")
    assert files.read_untrusted_log(planted / "rank-1.out", 100) == "a pty's line\nan old Mac's\n"  # as read_text
    assert (
        files.read_untrusted_log(planted / "rank-0.out", 10)
        == "[... cut: rank-0.out is 59 B, its last 10 B follow]\na\nthe end\n"
    )
    assert [files.read_untrusted_log(planted / name, 1 << 20) for name in ("zero.out", "fifo.out", "missing")] == [
        "zero.out is a symbolic link: not read\n",
        "fifo.out is not a regular file: not read\n",
        "",
    ]
