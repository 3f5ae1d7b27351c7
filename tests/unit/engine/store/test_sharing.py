"""Project stores: the modes a store's new files and directories get, read from its setgid bit."""

import os

from jupyter_podman_hpc.engine.store.sharing import Sharing


def made(path, mode):
    path.mkdir()
    os.chmod(path, mode)  # chmod, not mkdir's mode: the umask would take the group's bits
    return path


def test_a_personal_store_keeps_the_users_umask(tmp_path):
    sharing = Sharing.of(made(tmp_path / "store", 0o755))
    assert sharing == Sharing()
    assert (sharing.file_mode(), sharing.squash_mode(), sharing.dir_mode(), sharing.dir_mode(records=True)) == (
        None,
        None,
        None,
        None,
    )


def test_a_group_writable_project_store_is_sticky_but_for_its_record_directories(tmp_path):
    sharing = Sharing.of(made(tmp_path / "store", 0o2770))
    assert sharing == Sharing(group=True, group_write=True)
    assert (sharing.file_mode(), sharing.squash_mode()) == (0o660, 0o640)  # squash files: written once
    assert (sharing.dir_mode(), sharing.dir_mode(records=True)) == (0o3770, 0o2770)


def test_a_read_only_project_store_gives_its_group_read_only(tmp_path):
    sharing = Sharing.of(made(tmp_path / "store", 0o2750))
    assert sharing == Sharing(group=True, group_write=False)
    assert (sharing.file_mode(), sharing.squash_mode(), sharing.dir_mode()) == (0o640, 0o640, 0o2750)


def test_a_store_not_made_yet_is_shared_as_its_parent_directory_is(tmp_path):
    project = made(tmp_path / "project", 0o2770)
    assert Sharing.of(project / "store") == Sharing(group=True, group_write=True)
    assert Sharing.of(tmp_path / "nowhere" / "store") == Sharing()
