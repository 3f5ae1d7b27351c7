"""Shared pieces of the benchmarks: timing commands, statistics, machine facts, tables."""

from __future__ import annotations

import csv
import os
import platform
import shutil
import socket
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence


@dataclass(frozen=True)
class Sample:
    benchmark: str      # "launch", "lammps", ...
    config: str         # "bare", "podman-exec", ...
    size: str           # "4x8" (nodes x tasks per node), an image name, ...
    repetition: int
    metric: str         # "step_seconds", "loop_seconds", ...
    value: float


class BenchError(Exception):
    """A configuration failed: the benchmark reports it instead of a number."""


def timed(argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 900,
          cwd: str | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """Wall-clock seconds of one command, which must succeed."""
    start = time.perf_counter()
    result = subprocess.run(list(argv), env=dict(env) if env is not None else None, capture_output=True,
                            text=True, timeout=timeout, cwd=cwd)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise BenchError(f"{' '.join(argv[:6])} ... exited {result.returncode}: {' | '.join(tail)}")
    return elapsed, result


def summarize(samples: Iterable[Sample]) -> dict[tuple[str, str, str, str], dict[str, float]]:
    """(benchmark, metric, size, config) -> median, min, max, n."""
    groups: dict[tuple[str, str, str, str], list[float]] = {}
    for s in samples:
        groups.setdefault((s.benchmark, s.metric, s.size, s.config), []).append(s.value)
    return {key: {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
            for key, v in groups.items()}


def write_csv(samples: Sequence[Sample], path: Path) -> None:
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(asdict(samples[0]).keys()) if samples else ["benchmark"])
        writer.writeheader()
        for sample in samples:
            writer.writerow(asdict(sample))


def _version(argv: Sequence[str]) -> str:
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=30).stdout
        return out.strip().splitlines()[0] if out.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine() -> dict[str, str]:
    """What the results were measured on."""
    meminfo = Path("/proc/meminfo").read_text().split("\n")[0].split()[1]
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {
        "host": socket.gethostname(),
        "cpu": f"{os.cpu_count()} x {cpu}",
        "memory": f"{int(meminfo) // 1024 // 1024} GiB",
        "kernel": platform.release(),
        "os": _version(["sh", "-c", ". /etc/os-release; echo $PRETTY_NAME"]),
        "podman": _version(["podman", "--version"]),
        "slurm": _version(["sinfo", "--version"]),
        "mksquashfs": _version(["mksquashfs", "-version"]),
        "python": platform.python_version(),
        "nodes": "4 slurmd on one host (cluster-in-a-box)",
    }


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def which(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BenchError(f"{name} is not on PATH")
    return path
