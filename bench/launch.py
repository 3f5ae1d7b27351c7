"""Launch overhead: wall time of a job step running `true`, bare and in containers.

Configurations (each a command prefix run under `srun -N<n> --ntasks-per-node=<k>`):
bare srun; ours in podman-exec mode (joining, the default, and --no-join: podman exec); ours per-process
(`podman-hpc run --rm`); podman-hpc 1.2.2's `shared-run` and `run --rm`, each
tool on its own squashed copy of the same image. Repetitions alternate the
configurations so that drift on the machine spreads over all of them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from common import BenchError, Sample, timed

BENCHMARK = "launch"


@dataclass
class Setup:
    image: str
    ours_env: dict[str, str]
    peer_env: dict[str, str] | None
    peer_bin: str | None
    peer_squash: str | None


def prepare(image: str, work: Path, with_peer: bool) -> Setup:
    """Squash ``image`` for both tools, each into its own store on the shared scratch."""
    uid = os.getuid()
    ours_env = {**os.environ, "SQUASH_DIR": str(work / "squash-ours")}
    timed(["podman-hpc", "pull", image], ours_env)
    if not with_peer:
        return Setup(image, ours_env, None, None, None)
    peer_bin = os.environ["STACK_PEER_BIN"]
    peer_venv = os.environ["STACK_PEER_VENV"]
    key = uuid.uuid4().hex[:6]
    peer_env = {
        **os.environ,
        "PATH": f"{peer_venv}/bin:{os.environ['PATH']}:/usr/bin:/usr/sbin",
        "PODMANHPC_CONFIG_FILE": os.environ["STACK_PEER_CONFIG"],
        # its own node-local storage: ours and 1.2.2 keep their own podman state
        "PODMANHPC_GRAPH_ROOT": f"/tmp/{uid}_peer{key}/storage",
        "PODMANHPC_RUN_ROOT": f"/tmp/{uid}_peer{key}",
        "PODMANHPC_CONFIG_HOME": f"/tmp/{uid}_peer{key}/config",
    }
    peer_squash = str(work / "squash-peer")
    timed([peer_bin, "--squash-dir", peer_squash, "pull", image], peer_env)
    return Setup(image, ours_env, peer_env, peer_bin, peer_squash)


def configurations(setup: Setup, names: Sequence[str]) -> dict[str, Callable[[int, int], tuple[list[str], dict]]]:
    image = setup.image

    def srun(n: int, k: int) -> list[str]:
        return ["srun", f"-N{n}", f"--ntasks-per-node={k}"]

    table = {
        "bare": lambda n, k: ([*srun(n, k), "true"], setup.ours_env),
        "podman-exec": lambda n, k: ([*srun(n, k), "podman-hpc", "shared-run", image, "true"], setup.ours_env),
        "podman-exec --no-join": lambda n, k: (
            [*srun(n, k), "podman-hpc", "shared-run", "--no-join", image, "true"],
            setup.ours_env,
        ),
        "per-process": lambda n, k: ([*srun(n, k), "podman-hpc", "run", "--rm", image, "true"], setup.ours_env),
    }
    if setup.peer_bin:
        peer = [setup.peer_bin, "--squash-dir", setup.peer_squash]
        table["1.2.2 shared-run"] = lambda n, k: ([*srun(n, k), *peer, "shared-run", image, "true"], setup.peer_env)
        table["1.2.2 run"] = lambda n, k: ([*srun(n, k), *peer, "run", "--rm", image, "true"], setup.peer_env)
    missing = [name for name in names if name not in table]
    if missing:
        raise BenchError(f"unknown launch configurations: {missing}")
    return {name: table[name] for name in names}


def measure(
    setup: Setup,
    configs: Sequence[str],
    sizes: Sequence[tuple[int, int]],
    repetitions: int,
    log: Callable[[str], None] = print,
) -> list[Sample]:
    commands = configurations(setup, configs)
    for command in commands.values():  # warm up every node's storage once
        argv, env = command(4 if (4, 1) in sizes else sizes[0][0], 1)
        timed(argv, env)
    samples = []
    for repetition in range(repetitions):
        for nodes, per_node in sizes:
            order = list(commands.items())
            if repetition % 2:
                order.reverse()  # alternate, so no configuration always runs first
            for name, command in order:
                argv, env = command(nodes, per_node)
                seconds, _ = timed(argv, env)
                samples.append(Sample(BENCHMARK, name, f"{nodes}x{per_node}", repetition, "step_seconds", seconds))
                log(f"launch {name:<20} {nodes}x{per_node} rep {repetition}: {seconds:.2f} s")
    return samples
