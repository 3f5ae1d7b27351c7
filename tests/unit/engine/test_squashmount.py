"""Where the mount program keeps its squashfuse mounts and their references (engine/squashmount.py)."""

import os
import stat

from jupyter_podman_hpc.engine.squashmount import mounts_dir


def test_mounts_are_kept_in_the_users_own_unpack_directory(tmp_path):
    # a site template such as /dev/shm/unpacked-{{ uid }}: the parent is everyone's, the unpack directory the user's
    unpack = tmp_path / "unpacked-1001"
    unpack.mkdir(mode=0o700)
    found = mounts_dir(str(unpack), tmp_path / "graph" / "squash-mounts")
    assert found == unpack / "squash-mounts" / str(os.stat("/proc/self/ns/mnt").st_ino)
    assert not (tmp_path / "squash-mounts").exists()
    assert stat.S_IMODE(found.stat().st_mode) == stat.S_IMODE(found.parent.stat().st_mode) == 0o700


def test_without_an_unpack_directory_they_stay_beside_the_graph_root(tmp_path):
    state = tmp_path / "graph" / "squash-mounts"
    assert mounts_dir("", state) == state
