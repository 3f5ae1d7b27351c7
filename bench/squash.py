"""Squash time: our migrate, podman-hpc 1.2.2's migrate, and the floor, plain mksquashfs
of the same flattened root file system with the same compression (lz4)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from common import Sample, timed
from launch import Setup

BENCHMARK = "squash"


def _flatten(setup: Setup, work: Path) -> Path:
    """The image's root file system as plain files (owned as in the container)."""
    rootfs = work / "flat-rootfs"
    if rootfs.exists():
        return rootfs
    env = setup.ours_env
    container = subprocess.run(
        ["podman-hpc", "create", setup.image, "true"], env=env, check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        export = subprocess.Popen(["podman-hpc", "export", container], env=env, stdout=subprocess.PIPE)
        subprocess.run(
            ["podman", "unshare", "sh", "-c", 'mkdir -p "$1" && tar -C "$1" -xf -', "sh", str(rootfs)],
            stdin=export.stdout,
            check=True,
        )
        export.wait()
    finally:
        subprocess.run(["podman-hpc", "rm", "-f", container], env=env, capture_output=True)
    return rootfs


def measure(setup: Setup, work: Path, repetitions: int, log: Callable[[str], None] = print) -> list[Sample]:
    image = setup.image
    subprocess.run(
        ["podman-hpc", "pull", "-q", image],
        env={**setup.ours_env, "SQUASH_DIR": str(work / "warm")},
        check=True,
        capture_output=True,
    )
    rootfs = _flatten(setup, work)
    size = setup.image.rsplit("/", 1)[-1]
    samples = []
    for repetition in range(repetitions):
        runs: list[tuple[str, list[str], dict]] = [
            (
                "plain mksquashfs",
                [
                    "podman",
                    "unshare",
                    "mksquashfs",
                    str(rootfs),
                    str(work / "plain.squash"),
                    "-comp",
                    "lz4",
                    "-noappend",
                    "-quiet",
                    "-no-progress",
                ],
                dict(os.environ),
            ),
            ("ours", ["podman-hpc", "migrate", image], {**setup.ours_env, "SQUASH_DIR": str(work / "sq-ours")}),
        ]
        if setup.peer_bin:
            runs.append(
                ("1.2.2", [setup.peer_bin, "--squash-dir", str(work / "sq-peer"), "migrate", image], setup.peer_env)
            )
        if repetition % 2:
            runs.reverse()
        for name, argv, env in runs:
            for stale in ("sq-ours", "sq-peer", "plain.squash"):
                path = work / stale
                if path.is_dir():
                    subprocess.run(["podman", "unshare", "rm", "-rf", str(path)], check=False)
                path.unlink(missing_ok=True) if path.is_file() else None
            seconds, _ = timed(argv, env)
            samples.append(Sample(BENCHMARK, name, size, repetition, "squash_seconds", seconds))
            log(f"squash {name:<18} rep {repetition}: {seconds:.2f} s")
    subprocess.run(["podman", "unshare", "rm", "-rf", str(rootfs)], check=False)
    shutil.rmtree(work / "warm", ignore_errors=True)
    return samples
