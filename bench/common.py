"""Shared pieces of the benchmarks: timing commands, statistics, machine facts, tables."""

from __future__ import annotations

import csv
import hashlib
import os
import platform
import shutil
import socket
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from jupyter_podman_hpc.engine.base.locks import flocked


@dataclass(frozen=True)
class Sample:
    benchmark: str  # "launch", "lammps", ...
    config: str  # "bare", "podman-exec", ...
    size: str  # "4x8" (nodes x tasks per node), an image name, ...
    repetition: int
    metric: str  # "step_seconds", "loop_seconds", ...
    value: float


class BenchError(Exception):
    """A configuration failed: the benchmark reports it instead of a number."""


@dataclass(frozen=True)
class Failure:
    """A run that gave no number (the results file lists these)."""

    benchmark: str
    config: str
    size: str
    repetition: int
    message: str


# Open MPI across the fake nodes of one host: TCP over loopback (the shared-memory
# transport crashes across slurmd "nodes" that share one kernel).
MPI_ENV = {"OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "lo", "OMPI_MCA_oob_tcp_if_include": "lo"}


def alternating(items: Sequence, repetition: int) -> list:
    """``items`` in order on even repetitions, reversed on odd ones, so that no
    configuration always runs first (or right after the same neighbour)."""
    return list(reversed(items)) if repetition % 2 else list(items)


def timed(
    argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 900, cwd: str | None = None
) -> tuple[float, subprocess.CompletedProcess]:
    """Wall-clock seconds of one command, which must succeed."""
    start = time.perf_counter()
    result = subprocess.run(
        list(argv), env=dict(env) if env is not None else None, capture_output=True, text=True, timeout=timeout, cwd=cwd
    )
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
    return {
        key: {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)} for key, v in groups.items()
    }


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


def package_version(package: str) -> str:
    """The installed version of a Debian package on the host ("unknown" if it is not)."""
    return _version(["dpkg-query", "-W", "-f", "${Version}", package])


def machine() -> dict[str, str]:
    """What the results were measured on."""
    meminfo = Path("/proc/meminfo").read_text().split("\n")[0].split()[1]
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
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


# --- benchmark images: built once, squashed into a persistent store ----------------


def bench_root() -> Path:
    """Where benchmarks keep what outlives one run (images, generated workloads): ``$SCRATCH/bench``."""
    return Path(os.environ["SCRATCH"]) / "bench"


def image_store() -> Path:
    """The squashed store of the benchmark images (a cache: images are built only when missing)."""
    return bench_root() / "images"


def pulled_store() -> Path:
    """The squashed store of images pulled as they are (the base image, for the kernel benchmark).

    Not ``image_store()``: migrating an image built FROM the base image in
    another node-local storage rewrites the link of the base's layer in the
    store, and the base image, whose top layer that is, loses its squash file
    (engine bug, reported with issue 8's benchmarks). Images whose top layers
    differ, as the built ones, are not affected.
    """
    return bench_root() / "pulled"


def store_env(squash_dir: Path | None = None) -> dict[str, str]:
    """Our podman-hpc's environment with the benchmark images' squashed store."""
    return {**os.environ, "SQUASH_DIR": str(squash_dir or image_store())}


def locked(path: Path):
    """An exclusive lock held across processes (two benchmark runs building one image)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return flocked(path)


def image_digest(ref: str) -> str:
    """The registry's manifest digest of ``ref`` (the reference itself when it cannot be asked)."""
    try:
        result = subprocess.run(
            ["skopeo", "inspect", "--format", "{{.Digest}}", f"docker://{ref}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return ref
    return result.stdout.strip() if result.returncode == 0 and result.stdout.strip() else ref


def content_key(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:12]


def ensure_pulled(ref: str, log: Callable[[str], None] = print) -> str:
    """``ref`` (from a registry) in ``pulled_store()``: pulled and squashed once (again when the
    registry's digest changed)."""
    from jupyter_podman_hpc.engine.store.squashed import SquashStore

    store = pulled_store()
    with locked(bench_root() / ".pull.lock"):
        found = SquashStore(store).find(ref)
        if found is not None and SquashStore(store).has_complete(found.id) and found.digest in ("", image_digest(ref)):
            return ref
        pull_storage = PrivateStorage(f"pull-{os.getpid()}")
        log(f"pulling and squashing {ref} into {store} (once)")
        try:
            timed(["podman-hpc", "pull", ref], pull_storage.env(store_env(store)), timeout=1800)
        finally:
            pull_storage.remove(nodes=False)
    return ref


def squash_file(store: Path, ref: str) -> Path:
    """The squash file of ``ref`` in ``store``."""
    from jupyter_podman_hpc.engine.store.squashed import SquashStore

    found = SquashStore(store).find(ref)
    if found is None or not found.squash_file:
        raise BenchError(f"{ref} has no squash file in {store}")
    return Path(found.squash_file)


def ensure_image(
    name: str,
    containerfile: Path,
    context: Path,
    base: str,
    key_parts: Sequence[str] = (),
    log: Callable[[str], None] = print,
) -> str:
    """``localhost/jph-bench/<name>:<key>`` in the benchmark images' squashed store.

    The tag is a hash of the Containerfile, the base image's digest and
    ``key_parts`` (e.g. a generated workload's parameters): when the store has
    it, nothing is built. Otherwise ``podman-hpc build`` (FROM the base image,
    passed as the build argument BASE) in a throwaway node-local storage, then
    ``podman-hpc migrate`` into the store; the storage is removed afterwards
    (the squashed copy is the cache).
    """
    from jupyter_podman_hpc.engine.store.squashed import SquashStore

    key = content_key(containerfile.read_bytes(), image_digest(base), *key_parts)
    ref = f"localhost/jph-bench/{name}:{key}"
    store = image_store()
    with locked(bench_root() / f".{name}.lock"):
        found = SquashStore(store).find(ref)
        if found is not None and SquashStore(store).has_complete(found.id):
            return ref
        build_storage = PrivateStorage(f"build-{os.getpid()}")
        env = build_storage.env(store_env(store))
        log(f"building benchmark image {ref} (once; cached in {store})")
        try:
            started = time.perf_counter()
            timed(
                [
                    "podman-hpc",
                    "build",
                    "--build-arg",
                    f"BASE={base}",
                    "-t",
                    ref,
                    "-f",
                    str(containerfile),
                    str(context),
                ],
                env,
                timeout=3600,
            )
            timed(["podman-hpc", "migrate", ref], env, timeout=1800)
            log(f"built and squashed {ref} in {time.perf_counter() - started:.0f} s")
        finally:
            build_storage.remove(nodes=False)
    return ref


def remove_tree(path: Path) -> None:
    """Remove a directory that containers may have written to (files of subordinate uids)."""
    if path.exists():
        subprocess.run(["podman", "unshare", "rm", "-rf", str(path)], capture_output=True, check=False)
        shutil.rmtree(path, ignore_errors=True)


class PrivateStorage:
    """Podman storage of the benchmarks' own on every node (each node has a private /tmp).

    Runs start from a node-local storage that holds no image, as on a compute
    node that never pulled one: images come from the squashed store only, and
    whatever state other users of the machine left in the default storage
    cannot interfere. ``remove()`` deletes it on the login side and every node.
    """

    def __init__(self, tag: str):
        self.root = f"/tmp/{os.getuid()}_bench-{tag}"
        # unpacked copies of its own too (each node's /dev/shm), so that they can be dropped
        self.unpack_root = f"/dev/shm/{os.getuid()}_bench-{tag}"

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        return {
            **(base if base is not None else store_env()),
            "PODMANHPC_GRAPH_ROOT": f"{self.root}/storage",
            "PODMANHPC_RUN_ROOT": self.root,
            "PODMANHPC_CONFIG_HOME": f"{self.root}/config",
            "PODMANHPC_SQUASH_UNPACK_DIR": f"{self.unpack_root}/unpacked",
        }

    def _removal(self) -> list[str]:
        # podman's own `unshare` joins the namespace where the storage's mounts live
        script = (
            "podman-hpc rm --all --force --time 0 >/dev/null 2>&1; "
            'podman unshare sh -c \'umount -R "$1/storage/overlay" 2>/dev/null; rm -rf "$1" "$2"\' '
            'sh "$1" "$2"'
        )
        return ["sh", "-c", script, "sh", self.root, self.unpack_root]

    def remove(self, nodes: bool = True) -> None:
        env = self.env()
        subprocess.run(self._removal(), env=env, capture_output=True, check=False)
        if nodes:
            _on_every_node(self._removal(), env)

    def remove_on(self, node: str) -> None:
        """Remove it on ``node`` only."""
        subprocess.run(
            ["srun", "-N1", "-w", node, *self._removal()], env=self.env(), capture_output=True, check=False, timeout=600
        )


def _on_every_node(argv: Sequence[str], env: Mapping[str, str]) -> None:
    count = len(os.environ.get("STACK_NODES", "n1 n2 n3 n4").split())
    subprocess.run(
        ["srun", f"-N{count}", "--ntasks-per-node=1", *argv], env=env, capture_output=True, check=False, timeout=600
    )


# The podman-exec configuration on nodes that have not unpacked the image yet: a job's first step on a
# fresh node (each node of the stack has its own /dev/shm, as on a cluster). Not timed: dropping the copies.
FRESH_NODE = "podman-exec, fresh node"


def forget_unpacked(env: Mapping[str, str]) -> None:
    """Every node drops the unpacked copies of ``env``'s cache (its own unpack directory), so that the
    next step pays the unpack on each of its nodes."""
    _on_every_node(["podman", "unshare", "rm", "-rf", env["PODMANHPC_SQUASH_UNPACK_DIR"]], env)
