"""Read path: the same interpreter importing the same modules through each way a squashed
image's files can reach a container (the table behind ``squash_read_path``).

The squashed base image is mounted every candidate way at once inside podman's
user namespace, and the image's own ``python3`` (chrooted, with ``/dev`` and
``/proc`` bound in, no PYTHON* variables) imports what a kernel needs
(``ipykernel.kernelapp``, asyncio, email, http.server, unittest, ...), with the
image's byte code. Candidates alternate within each repetition; the first
import through each is left out (cold cache). Baseline: the same files as a
plain directory on the node's disk, what bare metal reads.

- ``squashfuse_ll``: the squash mount alone (no overlay);
- ``kernel overlay, read-only``: lowerdir only, no upper (a container with a read-only root);
- ``kernel overlay / squashfuse``: ``squash_read_path: kernel``;
- ``fuse-overlayfs / squashfuse``: ``squash_read_path: fuse``, podman-hpc 1.2.2's path;
- ``kernel overlay / tmpfs copy``: ``squash_read_path: unpacked`` (the default where it fits);
- ``fuse-overlayfs / tmpfs copy``: the copy without kernel overlayfs.

``unpack_seconds`` is what the unpacked path pays once per node and image:
unsquashfs of the image into tmpfs.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

BENCHMARK = "readpath"
IMPORTS = (
    "import asyncio, email.mime.multipart, http.server, unittest, json, decimal, "
    "xml.dom.minidom, sqlite3, argparse, ipykernel.kernelapp"
)
BASELINE = "plain directory"
CANDIDATES = [
    BASELINE,
    "squashfuse_ll",
    "kernel overlay, read-only",
    "kernel overlay / squashfuse",
    "fuse-overlayfs / squashfuse",
    "kernel overlay / tmpfs copy",
    "fuse-overlayfs / tmpfs copy",
]


def measure(base: str, work: Path, repetitions: int, log: Callable[[str], None] = print) -> list:
    from common import Sample, ensure_pulled, pulled_store, squash_file, timed

    ensure_pulled(base, log)
    squash = squash_file(pulled_store(), base)
    work.mkdir(parents=True, exist_ok=True)
    _, result = timed(
        ["podman", "unshare", sys.executable, __file__, str(squash), str(work), str(repetitions + 1)], timeout=1800
    )
    raw = json.loads(result.stdout.strip().splitlines()[-1])
    samples = [
        Sample(BENCHMARK, "unsquashfs to tmpfs", "base", rep, "unpack_seconds", seconds)
        for rep, seconds in enumerate(raw.pop("unpack"))
    ]
    for name, values in raw.items():
        for rep, seconds in enumerate(values[1:]):  # the first one warms the cache
            samples.append(Sample(BENCHMARK, name, "base", rep, "import_seconds", seconds))
        log(f"readpath {name:<30} median {statistics.median(values[1:]):.3f} s")
    return samples


# --- inside podman unshare ----------------------------------------------------------


def _sh(*argv: str) -> None:
    subprocess.run(list(argv), check=True, stdout=subprocess.DEVNULL)


def _mount_all(squash: Path, work: Path) -> dict[str, Path]:
    d = {name: work / name for name in ("plain", "sq", "copy", "empty", "ro", "ksq", "fsq", "kcp", "fcp")}
    for path in d.values():
        path.mkdir(parents=True, exist_ok=True)
    _sh("unsquashfs", "-no-progress", "-quiet", "-force", "-dest", str(d["plain"]), str(squash))
    _sh("squashfuse_ll", str(squash), str(d["sq"]))
    _sh("mount", "-t", "tmpfs", "tmpfs", str(d["copy"]))
    _sh("unsquashfs", "-no-progress", "-quiet", "-force", "-dest", str(d["copy"] / "root"), str(squash))

    def upper(name: str) -> str:
        (work / f"{name}.u").mkdir(exist_ok=True)
        (work / f"{name}.w").mkdir(exist_ok=True)
        return f"upperdir={work}/{name}.u,workdir={work}/{name}.w"

    _sh("mount", "-t", "overlay", "overlay", "-o", f"lowerdir={d['sq']}:{d['empty']}", str(d["ro"]))
    _sh("mount", "-t", "overlay", "overlay", "-o", f"lowerdir={d['sq']},{upper('ksq')},userxattr", str(d["ksq"]))
    _sh("fuse-overlayfs", "-o", f"lowerdir={d['sq']},{upper('fsq')}", str(d["fsq"]))
    _sh("mount", "-t", "overlay", "overlay", "-o", f"lowerdir={d['copy']}/root,{upper('kcp')},userxattr", str(d["kcp"]))
    _sh("fuse-overlayfs", "-o", f"lowerdir={d['copy']}/root,{upper('fcp')}", str(d["fcp"]))
    roots = dict(zip(CANDIDATES, [d["plain"], d["sq"], d["ro"], d["ksq"], d["fsq"], d["kcp"], d["fcp"]], strict=True))
    for root in roots.values():
        _sh("mount", "--rbind", "/dev", str(root / "dev"))
        _sh("mount", "--rbind", "/proc", str(root / "proc"))
    return roots


def _unmount_all(work: Path) -> None:
    with open("/proc/self/mountinfo") as mountinfo:
        targets = [line.split()[4] for line in mountinfo if f" {work}/" in line]
    for target in sorted(targets, key=len, reverse=True):  # deepest first
        subprocess.run(["umount", "-l", target], check=False)
    subprocess.run(["rm", "-rf", "--one-file-system", str(work)], check=False)


def _unpack_seconds(squash: Path, work: Path) -> float:
    target = work / "copy" / "again"
    start = time.perf_counter()
    _sh("unsquashfs", "-no-progress", "-quiet", "-dest", str(target), str(squash))
    elapsed = time.perf_counter() - start
    subprocess.run(["rm", "-rf", str(target)], check=True)
    return elapsed


def _inside(squash: Path, work: Path, runs: int) -> dict[str, list[float]]:
    work = work / "readpath"
    _unmount_all(work)
    try:
        roots = _mount_all(squash, work)
        results: dict[str, list[float]] = {name: [] for name in roots}
        results_unpack = []
        for repetition in range(runs):
            order = list(roots) if repetition % 2 == 0 else list(reversed(roots))
            for name in order:
                start = time.perf_counter()
                subprocess.run(
                    [
                        "env",
                        "-i",
                        "PATH=/usr/bin:/bin",
                        "/usr/sbin/chroot",
                        str(roots[name]),
                        "/usr/bin/python3",
                        "-c",
                        IMPORTS,
                    ],
                    check=True,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                results[name].append(time.perf_counter() - start)
            if repetition:
                results_unpack.append(_unpack_seconds(squash, work))
        return {**results, "unpack": results_unpack}
    finally:
        _unmount_all(work)


if __name__ == "__main__":
    print(json.dumps(_inside(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))))
