"""Where the mount program keeps its squashfuse mounts and their references (engine/mount/squashfuse.py)."""

import os
import stat

from jupyter_podman_hpc.engine.mount.squashfuse import mounts_dir


def test_mounts_are_kept_with_the_unpacked_copies_in_a_directory_of_the_users(tmp_path):
    namespace = str(os.stat("/proc/self/ns/mnt").st_ino)
    own = tmp_path / "1001_hpc"  # the default /dev/shm/<uid>_hpc: beside the copies
    own.mkdir(mode=0o700)
    assert mounts_dir(f"{own}/unpacked", tmp_path / "graph") == own / "squash-mounts" / namespace
    # a site template such as /dev/shm/unpacked-{{ uid }}: the parent is everyone's, the unpack directory the user's
    shared = tmp_path / "shm"
    shared.mkdir()
    shared.chmod(0o1777)
    found = mounts_dir(f"{shared}/unpacked-1001", tmp_path / "graph" / "squash-mounts")
    assert found == shared / "unpacked-1001" / "squash-mounts" / namespace
    assert sorted(os.listdir(shared)) == ["unpacked-1001"]
    assert stat.S_IMODE(found.stat().st_mode) == stat.S_IMODE(found.parent.stat().st_mode) == 0o700


def test_without_an_unpack_directory_they_stay_beside_the_graph_root(tmp_path):
    state = tmp_path / "graph" / "squash-mounts"
    assert mounts_dir("", state) == state
