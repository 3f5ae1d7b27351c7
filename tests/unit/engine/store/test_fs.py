"""A shared tree's files reached without following links: what a member could plant in a
project store is refused, and the files it points at are left as they were."""

import os
import stat

import pytest

from jupyter_podman_hpc.engine.store.fs import EntryRefused, Tree, make_dirs


@pytest.fixture
def victim_file(tmp_path):
    """A file of the user's outside the store (their ssh key, say)."""
    path = tmp_path / "home" / "id_ed25519"
    path.parent.mkdir()
    path.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    path.chmod(0o600)
    return path


def unchanged(path):
    return path.read_text() == "-----BEGIN OPENSSH PRIVATE KEY-----\n" and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_lock_file_swapped_for_a_link_is_refused_and_not_followed(tmp_path, victim_file):
    (tmp_path / "store" / "overlay-images").mkdir(parents=True)
    (tmp_path / "store" / "overlay-images" / "images.lock").symlink_to(victim_file)
    with pytest.raises(EntryRefused) as refused:
        Tree(tmp_path / "store").lock_file(("overlay-images",), "images.lock", 0o660)
    assert str(refused.value).startswith(
        f"refusing to use {tmp_path}/store/overlay-images/images.lock: it is a symbolic link"
    )
    assert "\n" not in str(refused.value) and unchanged(victim_file)


def test_a_lock_file_with_other_hard_links_is_refused(tmp_path, victim_file):
    store = tmp_path / "store"
    store.mkdir()
    os.link(victim_file, store / "layers.lock")
    with pytest.raises(EntryRefused, match="it has other hard links"):
        Tree(store).lock_file((), "layers.lock", 0o660)
    assert unchanged(victim_file)


def test_a_new_lock_file_is_ours_with_the_stores_mode_and_an_old_one_keeps_its_mode(tmp_path):
    tree = Tree(tmp_path)
    os.close(tree.lock_file((), "images.lock", 0o660))
    assert stat.S_IMODE((tmp_path / "images.lock").stat().st_mode) == 0o660
    (tmp_path / "images.lock").chmod(0o644)
    os.close(tree.lock_file((), "images.lock", 0o660))  # never chmod what we did not just create
    assert stat.S_IMODE((tmp_path / "images.lock").stat().st_mode) == 0o644


def test_a_directory_on_the_way_that_is_a_link_is_refused(tmp_path, victim_file):
    (tmp_path / "store" / "overlay").mkdir(parents=True)
    (tmp_path / "store" / "overlay" / ("a" * 64)).symlink_to(victim_file.parent)
    tree = Tree(tmp_path / "store")
    with pytest.raises(EntryRefused, match="is a symbolic link or not a directory"):
        tree.read(("overlay", "a" * 64), "id_ed25519")
    with pytest.raises(EntryRefused):
        tree.rmtree(("overlay",), "a" * 64)  # rm -rf of a planted link: refused, the target kept
    with pytest.raises(EntryRefused):
        tree.write(("overlay", "a" * 64), "link", b"X", 0o660)
    assert tree.lstat(("overlay", "a" * 64), "id_ed25519") is None
    assert unchanged(victim_file) and sorted(os.listdir(victim_file.parent)) == ["id_ed25519"]


def test_a_fifo_or_a_link_in_place_of_a_record_is_refused_without_hanging(tmp_path, victim_file):
    os.mkfifo(tmp_path / "images.json")
    with pytest.raises(EntryRefused, match="not a regular file"):
        Tree(tmp_path).read((), "images.json")
    (tmp_path / "layers.json").symlink_to(victim_file)
    with pytest.raises(EntryRefused, match="symbolic link"):
        Tree(tmp_path).read((), "layers.json")
    assert Tree(tmp_path).read((), "missing.json") is None


def test_removing_a_tree_removes_links_in_it_not_what_they_point_at(tmp_path, victim_file):
    layer = tmp_path / "store" / "overlay" / ("b" * 64)
    (layer / "diff").mkdir(parents=True)
    (layer / "diff" / "escape").symlink_to(victim_file.parent)
    Tree(tmp_path / "store").rmtree(("overlay",), "b" * 64)
    assert not layer.exists() and unchanged(victim_file)
    Tree(tmp_path / "store").rmtree(("overlay",), "b" * 64)  # a missing one is fine


def test_created_files_and_directories_get_their_mode_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        tree = Tree(tmp_path)
        with tree.directory(("overlay", "l"), 0o3770, create=True):
            pass
        fd = tree.create(("overlay", "l"), ".X.squash.partial", 0o640)
        os.close(fd)
        with pytest.raises(FileExistsError):
            tree.create(("overlay", "l"), ".X.squash.partial", 0o640)  # O_EXCL: never someone else's file
        make_dirs(tmp_path / "a" / "b", 0o2770)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "overlay").stat().st_mode) == 0o3770
    assert stat.S_IMODE((tmp_path / "overlay" / "l").stat().st_mode) == 0o3770
    assert stat.S_IMODE((tmp_path / "overlay" / "l" / ".X.squash.partial").stat().st_mode) == 0o640
    assert {stat.S_IMODE((tmp_path / p).stat().st_mode) for p in ("a", "a/b")} == {0o2770}
