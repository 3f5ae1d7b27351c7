"""What the fault-injection tests share: the one line a user reads, this test's own mounts, a small
ext4 file system that fills up (fuse2fs, as the test's user) and a registry front the test kills
and restarts (tests/faults/registry_front.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.hpc import Hpc
from tests.helpers.servers import free_port

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
                out.write(block[: min(len(block), remaining)])
                remaining -= len(block)
            out.flush()
            os.fsync(out.fileno())
        return filler


def is_mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as mountinfo:
        return any(line.split()[4] == str(path) for line in mountinfo)


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
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.registry_front", self.upstream, str(self.port), str(rate)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
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
