"""Fixtures of the fault-injection tests: file systems that fill up and a registry that goes away.

The stack's ``hpc`` fixture (private storage per test, leftovers per node) comes from
tests/conftest.py; the helpers (SmallFs, RegistryFront, one_line, own_mounts) from
tests/helpers/faults.py. Faults are injected for real and without root (the tests run
as the stack's user): a store's file system is a small ext4 image mounted with fuse2fs (a
real ENOSPC where the engine and mksquashfs write, in every mount namespace of the user), the
unpack cache a size-limited tmpfs mounted in podman's user namespace (where the mount program
unpacks), the registry a process of the test's own in front of the stack's.
"""

from __future__ import annotations

import os
import shutil
import uuid

import pytest

from tests.helpers.commands import run
from tests.helpers.faults import RegistryFront, SmallFs, is_mounted

# --- a small file system that fills up ------------------------------------------------------


@pytest.fixture
def small_fs(hpc):
    """A factory of small file systems on the test's scratch, unmounted at the end."""
    made: list[SmallFs] = []
    if not shutil.which("fuse2fs"):
        pytest.fail("fuse2fs is not installed: the stack's package list needs it (dev/stack up)")

    def make(size_mb: int, podman_storage: bool = False) -> SmallFs:
        """``podman_storage``: for a graph root, whose files podman's user namespace gives many
        owners (fuse2fs, run by the user, then checks no permission: ``fakeroot``)."""
        key = uuid.uuid4().hex[:6]
        image, mount = hpc.work / f"fs-{key}.ext4", hpc.work / f"fs-{key}"
        run(["truncate", "-s", f"{size_mb}M", image])
        run(["/usr/sbin/mkfs.ext4", "-q", "-F", "-m", "0", "-E", f"root_owner={os.getuid()}:{os.getgid()}", image])
        mount.mkdir()
        run(["fuse2fs", *(["-o", "fakeroot"] if podman_storage else []), image, mount])
        made.append(SmallFs(mount, image))
        return made[-1]

    yield make
    for fs in made:
        run(["fusermount", "-u", "-z", fs.path], check=False)
        assert not is_mounted(fs.path)


# --- a tmpfs that fills up, in podman's user namespace -----------------------------------------


@pytest.fixture
def small_tmpfs(hpc):
    """A factory: a tmpfs of ``size_mb`` MiB on ``path`` in podman's namespace (where podman and the
    mount program write: the graph root, the unpack cache); returns a function that unmounts it
    (the fault gone). Whatever is still mounted is unmounted at the end."""
    mounted: list[str] = []

    def unmount() -> None:
        while mounted:
            hpc.sh("podman", "unshare", "umount", mounted.pop())

    def make(path: str, size_mb: int):
        hpc("infohpc")  # makes the user's state directories, the unpack cache among them
        hpc.sh("podman", "unshare", "mkdir", "-p", path)
        hpc.sh("podman", "unshare", "mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", path)
        mounted.append(path)
        return unmount

    yield make
    unmount()


# --- a registry that goes away ----------------------------------------------------------------


@pytest.fixture
def registry_front(stack, hpc):
    front = RegistryFront(stack.registry, hpc.work)
    yield front
    front.kill()


@pytest.fixture
def pushed_image(stack, hpc):
    """An image in the stack's registry with a 12 MB layer that does not compress (a pull of it
    takes seconds through a slow front); removed from the registry at the end."""
    name = f"{stack.registry}/tests/faults-{uuid.uuid4().hex[:8]}:latest"
    context = hpc.work / "pushed-ctx"
    context.mkdir()
    (context / "Containerfile").write_text(f"FROM {stack.tiny_image}\nRUN head -c 12000000 /dev/urandom > /blob\n")
    run(["podman", "build", "--network", "host", "-q", "-t", name, context])
    run(["podman", "push", "-q", name])
    run(["podman", "rmi", "--ignore", name], check=False)
    yield name
    run(["skopeo", "delete", "--tls-verify=false", f"docker://{name}"], check=False)
