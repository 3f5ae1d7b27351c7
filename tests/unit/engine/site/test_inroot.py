"""inroot: lookups inside a root directory never leave it, through openat2 or the walk."""

import errno
import os

import pytest

from jupyter_podman_hpc.engine.site import inroot


@pytest.fixture(params=["openat2", "walk"])
def resolver(request, monkeypatch):
    """open_in_root as the kernel does it, and as the fallback walk does it."""
    monkeypatch.setattr(inroot, "_have_openat2", None if request.param == "openat2" else False)
    return request.param


@pytest.fixture
def tree(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "opt").mkdir(parents=True)
    (root / "usr" / "lib").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_text("host\n")
    (root / "lib").symlink_to("usr/lib")  # merged /usr, as images have
    (root / "opt" / "abs").symlink_to(outside)  # absolute, to the host
    (root / "opt" / "rel").symlink_to("../../../../../../.." + str(outside))  # climbing out
    (root / "opt" / "loop").symlink_to("loop")
    (root / "file").write_text("x")
    fd = os.open(root, inroot.DIRECTORY)
    yield root, outside, fd
    os.close(fd)


def where(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def resolved(root_fd: int, path: str) -> str:
    """Where ``path`` leads from the root ``root_fd``."""
    opened = inroot.open_in_root(root_fd, path)
    try:
        return where(opened)
    finally:
        os.close(opened)


@pytest.mark.parametrize("link", ["abs", "rel"])
def test_a_symlink_to_the_host_resolves_inside_the_root(resolver, tree, link):
    root, outside, fd = tree
    with pytest.raises(FileNotFoundError):
        os.close(inroot.open_in_root(fd, f"/opt/{link}/secret", os.O_RDONLY))
    with pytest.raises(FileNotFoundError):  # its target's directory is not in the root
        inroot.open_in_root(fd, f"/opt/{link}/new", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    inside = root / str(outside).lstrip("/")
    inside.mkdir(parents=True)
    os.close(inroot.open_in_root(fd, f"/opt/{link}/new", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    assert sorted(os.listdir(outside)) == ["secret"]
    assert sorted(os.listdir(inside)) == ["new"]


def test_dotdot_never_climbs_above_the_root(resolver, tree):
    root, _, fd = tree
    assert resolved(fd, "/../../../usr/../../lib") == str(root / "usr" / "lib")


def test_an_image_symlink_inside_the_root_is_followed(resolver, tree):
    root, _, fd = tree
    assert resolved(fd, "/lib") == str(root / "usr" / "lib")


def test_loops_and_files_are_errors(resolver, tree):
    _, _, fd = tree
    with pytest.raises(OSError) as loop:
        inroot.open_in_root(fd, "/opt/loop/x")
    assert loop.value.errno == errno.ELOOP
    with pytest.raises(NotADirectoryError):
        inroot.open_in_root(fd, "/file/x")


@pytest.mark.parametrize("link", ["abs", "rel"])
def test_make_dirs_through_a_symlink_makes_its_target_inside_the_root(resolver, tree, link):
    root, outside, fd = tree
    made = inroot.make_dirs(fd, f"/opt/{link}/a/b")
    try:
        assert where(made) == str(root) + str(outside) + "/a/b"
    finally:
        os.close(made)
    assert sorted(os.listdir(outside)) == ["secret"]
