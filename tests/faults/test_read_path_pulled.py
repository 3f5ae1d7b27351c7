"""A read path pulled away under a running container, on the real stack: the squashfuse of its
lower layer killed, its unpacked copy removed. The running container fails visibly, the next
container on the node gets a fresh mount or copy, and ``infohpc`` says what happened."""

from __future__ import annotations

import time
import uuid

import psutil
import pytest

from tests.helpers.faults import own_mounts

pytestmark = [pytest.mark.faults, pytest.mark.integration]

OS_RELEASE = 'NAME="jph tiny"'


def squashfuse_of(hpc) -> list[psutil.Process]:
    """The squashfuse processes that mount this test's squashed store."""
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        if (process.info["name"] or "").startswith("squashfuse") and any(
            str(hpc.squash_dir) in arg for arg in process.info["cmdline"] or []
        ):
            found.append(process)
    return found


def detached(hpc, image: str) -> str:
    name = f"pulled-{uuid.uuid4().hex[:6]}"
    hpc("run", "-d", "--name", name, image, "sleep", "600")
    return name


def fell_back(hpc) -> list[str]:
    return [line for line in hpc("infohpc").stdout.splitlines() if line.startswith(" fell back: ")]


def nothing_mounted_within(hpc, seconds: float = 10) -> list[str]:
    """The storage's mounts left once the containers' watchers had ``seconds`` to unmount."""
    deadline = time.monotonic() + seconds
    while (left := own_mounts(hpc)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.fixture
def squashed(hpc, stack):
    """The tiny image in this test's squashed store only, as on a node that never pulled it."""
    hpc("pull", stack.tiny_image)
    hpc.wipe_local_storage()
    return stack.tiny_image


def test_a_killed_squashfuse_fails_its_container_and_the_next_gets_a_fresh_mount(hpc, squashed):
    hpc.env["PODMANHPC_SQUASH_READ_PATH"] = "kernel"  # squashfuse below kernel overlayfs, no copy
    running = detached(hpc, squashed)
    [fuse] = squashfuse_of(hpc)
    fuse.kill()
    fuse.wait(10)

    broken = hpc("exec", running, "cat", "/etc/os-release", check=False)
    print(f"the running container reads: {broken.stderr.strip()!r}")
    assert broken.returncode != 0 and OS_RELEASE not in broken.stdout, broken
    assert broken.stderr.strip(), "the failure must be visible"

    following = detached(hpc, squashed)
    assert hpc("exec", following, "cat", "/etc/os-release").stdout.startswith(OS_RELEASE)
    [fresh] = squashfuse_of(hpc)
    assert fresh.pid != fuse.pid
    lines = fell_back(hpc)
    assert any(
        "squashfuse mount of " in line and " had died under its containers: mounted again" in line for line in lines
    ), lines

    hpc("rm", "--force", "--time", "0", running, following)
    assert nothing_mounted_within(hpc) == []
    assert squashfuse_of(hpc) == []


def test_a_removed_unpacked_copy_fails_its_container_and_the_next_unpacks_again(hpc, squashed):
    hpc.env["PODMANHPC_SQUASH_READ_PATH"] = "unpacked"  # unpack on this login node too
    running = detached(hpc, squashed)
    cache = hpc.unpack_dir
    [copy] = [name for name in hpc.sh("podman", "unshare", "ls", "-A", cache).stdout.split() if len(name) == 32]
    # its tree holds files of the image's other users: removed in podman's user namespace
    hpc.sh("podman", "unshare", "rm", "-rf", cache / copy)

    broken = hpc("exec", running, "cat", "/etc/os-release", check=False)
    print(f"the running container reads: {broken.stderr.strip()!r}")
    assert broken.returncode != 0 and OS_RELEASE not in broken.stdout, broken
    assert broken.stderr.strip(), "the failure must be visible"

    assert hpc("run", "--rm", squashed, "cat", "/etc/os-release").stdout.startswith(OS_RELEASE)
    assert copy in hpc.sh("podman", "unshare", "ls", "-A", cache).stdout.split()  # the same file: the same key
    lines = fell_back(hpc)
    assert any(
        f"unpacked copy {copy} " in line and " was gone " in line and "unpacked again" in line for line in lines
    ), lines

    hpc("rm", "--force", "--time", "0", running)
    assert nothing_mounted_within(hpc) == []
