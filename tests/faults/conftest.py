"""Fixtures of the fault-injection tests: file systems that fill up and a registry that goes away.

The stack's ``hpc`` fixtures (private storage per test, leftovers per node) come from
tests/integration/conftest.py. Faults are injected for real and without root (the tests run
as the stack's user): a store's file system is a small ext4 image mounted with fuse2fs (a
real ENOSPC where the engine and mksquashfs write, in every mount namespace of the user), the
unpack cache a size-limited tmpfs mounted in podman's user namespace (where the mount program
unpacks), the registry a process of the test's own in front of the stack's.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import run
from tests.integration.conftest import Hpc, cleanup_hpc, hpc, make_hpc  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[2]


def one_line(text: str) -> str:
    """The only non-empty line of ``text`` (what a user reads); fails with all of it otherwise."""
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got {len(lines)}:\n{text}"
    print(f"the user reads: {lines[0]}")  # shown by pytest -rP: the line each fault gives
    return lines[0]


def own_mounts(hpc: Hpc) -> list[str]:
    """``hpc.mounts()`` of this test's storage only: other people's tests and benchmarks of the
    same user share podman's namespace, and their fuse-overlayfs mounts are theirs to remove."""
    ours = (hpc.env["PODMANHPC_RUN_ROOT"], str(hpc.squash_dir), hpc.env["PODMANHPC_SQUASH_UNPACK_DIR"])
    return [line for line in hpc.mounts() if any(path in line for path in ours)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- a small file system that fills up ------------------------------------------------------


@dataclass
class SmallFs:
    """An ext4 file system of ``size_mb`` mounted (fuse2fs, as the test's user) on ``path``."""

    path: Path
    image: Path

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave_mb: float) -> Path:
        """A filler file that leaves about ``leave_mb`` MiB free; remove it to free the space."""
        filler = self.path / "filler"
        with open(filler, "wb") as out:
            out.truncate(0)
            remaining = self.free() - int(leave_mb * 2**20)
            block = os.urandom(1 << 20)
            while remaining > 0:
                out.write(block[:min(len(block), remaining)])
                remaining -= len(block)
            out.flush()
            os.fsync(out.fileno())
        return filler


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


def is_mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as mountinfo:
        return any(line.split()[4] == str(path) for line in mountinfo)


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


class RegistryFront:
    """The registry a pull talks to (``registry_front``), as a process the test kills and restarts."""

    def __init__(self, upstream: str, work: Path):
        self.upstream = upstream
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.conf = work / "registries.conf"
        system = Path("/etc/containers/registries.conf")
        text = system.read_text() if system.exists() else ""
        self.conf.write_text(f'{text}\n[[registry]]\nlocation = "{self.address}"\ninsecure = true\n')

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, rate: int) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "tests.faults.registry_front", self.upstream,
                                         str(self.port), str(rate)], cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout.readline().strip() == "ready"

    def wait_for_blob(self, timeout: float = 120) -> None:
        """Until a blob's body is being served (the pull is under way)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if line.startswith("blob "):
                return
            assert line, "the registry front ended before any blob was asked for"
        raise AssertionError("no blob was pulled")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
        self.process = None


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
