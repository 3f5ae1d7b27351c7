"""DeepCAM-like: data-parallel training of a segmentation CNN, split as the published figure splits it.

The published Perlmutter comparison's third benchmark is DeepCAM (MLPerf
HPC climate segmentation), where per-process containers showed their
start-up cost. Every rank here runs ``deepcam_train.py`` (its docstring
says what it trains): a small U-Net on synthetic climate-like fields,
``torch.distributed`` data parallel with gloo over loopback, a fixed
``Problem`` (samples, global batch, epochs) on every size: strong scaling.

Configurations, every one under ``srun --kill-on-bad-exit=1``:

- ``bare``: the host's ``/usr/bin/python3`` with Debian's python3-torch;
- ``podman-exec``: ``podman-hpc shared-run ... IMAGE python3 ...``;
- ``podman-exec, fresh node``: the same after every node dropped its unpacked copy of IMAGE (not
  timed): a job's first step on its nodes, each paying its own unpack (``container_start_seconds``);
- ``per-process``: ``podman-hpc run --rm ... IMAGE python3 ...``;

where IMAGE is the base image plus the same Debian packages
(``Containerfile.deepcam``), run from the squashed store with a node-local
storage that never pulled it; the script is read from the shared scratch
(bind-mounted), as bare metal reads it.

Every rank reports wall-clock milestones (one clock for all the "nodes"
of this machine): its first line, its first training iteration, its end.
The three phases end at the *slowest rank's* milestone, so that they stack
to the job's time and a rank that waits for a slower one at the rendezvous
is not counted twice:

- ``container_start_seconds``: from just before ``srun`` to the last
  rank's first line (allocation, container start, the interpreter);
- ``startup_seconds``: from there to the last rank's first iteration
  (imports, data, model, process group; the rendezvous waits for everyone);
- ``loop_seconds``: from there to the last rank's end of training;
- ``step_seconds``: the wall time of the whole ``srun`` (with teardown).

Sizes: 1, 2 and 4 nodes x 1 task, and 4 x 2, one torch thread per rank.
The machine has 2 cores shared by all four "nodes", so 1 -> 2 nodes is
real strong scaling and 4 nodes oversubscribe the cores; all
configurations see the same oversubscription, so their comparison holds
at every size, the scaling past 2 ranks says nothing about the engine.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from common import (
    FRESH_NODE,
    BenchError,
    Failure,
    PrivateStorage,
    Sample,
    alternating,
    ensure_image,
    forget_unpacked,
    package_version,
    timed,
)

BENCHMARK = "deepcam"
CONFIGS = ["bare", "podman-exec", FRESH_NODE, "per-process"]
FULL_SIZES = [(1, 1), (2, 1), (4, 1), (4, 2)]
SMOKE_SIZES = [(2, 1)]  # two ranks on two nodes: the gloo rendezvous across nodes is exercised
PHASES = ["container_start_seconds", "startup_seconds", "loop_seconds"]
HERE = Path(__file__).resolve().parent
CONTAINERFILE = HERE / "Containerfile.deepcam"
TRAIN = HERE / "deepcam_train.py"
PYTHON = "/usr/bin/python3"
RESULT = re.compile(
    r"^DEEPCAM rank=(\d+) first_line=([0-9.]+) first_iter=([0-9.]+) end=([0-9.]+) "
    r"first_loss=([0-9.]+) last_loss=([0-9.]+) checksum=([0-9.]+)$",
    re.M,
)


@dataclass(frozen=True)
class Problem:
    samples: int  # in the global data set, 4 channels of 96 x 144
    batch: int  # global batch, split over the ranks
    epochs: int

    def __str__(self) -> str:
        return f"{self.samples} samples of 4 x 96 x 144, global batch {self.batch}, {self.epochs} epochs"


# About 14 s of training loop for one rank on one core of this machine (quiet), 5 s of start-up.
FULL = Problem(samples=64, batch=16, epochs=8)
SMOKE = Problem(samples=16, batch=8, epochs=2)
WARM_UP = Problem(samples=16, batch=8, epochs=2)  # two: a run must show the loss going down


@dataclass
class Setup:
    image: str
    work: Path  # on the shared scratch: the training script
    env: dict[str, str]


@dataclass(frozen=True)
class Phases:
    container_start: float
    startup: float
    loop: float
    step: float


def host_torch() -> str:
    """Debian's torch version on the host, which bare metal needs."""
    result = subprocess.run(
        [PYTHON, "-E", "-c", "import numpy, torch; print(torch.__version__)"], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise BenchError(
            "the host's python3 cannot import torch and numpy: install Debian's python3-torch and "
            "python3-numpy (dev/stack up does) for the bare-metal runs"
        )
    return result.stdout.strip()


def prepare(base_image: str, work: Path, storage: PrivateStorage, log: Callable[[str], None] = print) -> Setup:
    """Torch on the host, the benchmark image in the squashed store, the script on the scratch;
    containers run with the nodes' ``storage``."""
    host_torch()
    context = work / "deepcam-context"  # the Containerfile needs no files: an empty build context
    context.mkdir(parents=True, exist_ok=True)
    image = ensure_image("deepcam", CONTAINERFILE, context, base_image, log=log)
    directory = work / "deepcam"
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(TRAIN, directory / TRAIN.name)
    return Setup(image, directory, storage.env())


def describe(problem: Problem) -> str:
    version = package_version("python3-torch")
    return (
        f"A small U-Net segmenting synthetic climate-like fields, {problem}, strong scaling; "
        f"Debian python3-torch {version} on the host and in the image; DDP with gloo over loopback, "
        "one torch thread per rank (4 nodes share the machine's 2 cores). Phases end at the slowest "
        "rank's milestone: container start = srun to the last rank's first line, start-up = to the last "
        "rank's first training iteration (imports, data, model, process group), loop = to the last "
        "rank's end of training; step seconds: wall time of the whole srun."
    )


def free_port() -> int:
    """A loopback port for the rendezvous of one run (rank 0 listens on it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def command(setup: Setup, config: str, nodes: int, per_node: int, problem: Problem) -> list[str]:
    srun = ["srun", f"-N{nodes}", f"--ntasks-per-node={per_node}", "--kill-on-bad-exit=1"]
    script = str(setup.work / TRAIN.name)
    app = [
        PYTHON,
        "-E",
        "-B",
        script,
        "--master-port",
        str(free_port()),
        "--samples",
        str(problem.samples),
        "--batch",
        str(problem.batch),
        "--epochs",
        str(problem.epochs),
    ]
    mount = ["-v", f"{setup.work}:{setup.work}:ro", "-w", str(setup.work)]
    if config == "bare":
        return [*srun, *app]
    if config in ("podman-exec", FRESH_NODE):
        return [*srun, "podman-hpc", "shared-run", *mount, setup.image, *app]
    if config == "per-process":
        return [*srun, "podman-hpc", "run", "--rm", *mount, setup.image, *app]
    raise BenchError(f"unknown deepcam configuration: {config}")


def phases(stdout: str, started: float, step: float, ranks: int, label: str) -> Phases:
    """The run's phases from every rank's line, which must all be there and agree."""
    found = RESULT.findall(stdout)
    reported = sorted(int(r[0]) for r in found)
    if reported != list(range(ranks)):
        tail = " | ".join(stdout.strip().splitlines()[-3:])
        raise BenchError(f"{label}: ranks {reported} reported, not 0-{ranks - 1}: {tail}")
    if len({r[6] for r in found}) != 1:
        raise BenchError(f"{label}: the ranks' trained weights differ (checksums {sorted({r[6] for r in found})})")
    first_loss, last_loss = float(found[0][4]), float(found[0][5])
    if not last_loss < first_loss:
        raise BenchError(f"{label}: the loss did not go down ({first_loss} -> {last_loss}): nothing was learnt")
    first_line = max(float(r[1]) for r in found)
    first_iter = max(float(r[2]) for r in found)
    end = max(float(r[3]) for r in found)
    return Phases(first_line - started, first_iter - first_line, end - first_iter, step)


def wait_for_idle_nodes(timeout: float = 120) -> None:
    """Every node idle: the previous run's job may still be completing, and srun's wait for it
    would count as container start."""
    from jupyter_podman_hpc.slurm.client import SlurmClient

    client = SlurmClient()
    deadline = time.monotonic() + timeout
    while not all(p.idle == p.nodes for p in client.partitions()):
        if time.monotonic() > deadline:
            raise BenchError(f"the nodes are not idle after {timeout:.0f} s: another job holds them")
        time.sleep(0.1)


def run_once(setup: Setup, config: str, nodes: int, per_node: int, problem: Problem) -> Phases:
    argv = command(setup, config, nodes, per_node, problem)
    if config == FRESH_NODE:
        forget_unpacked(setup.env)
    wait_for_idle_nodes()
    started = time.time()
    step, result = timed(argv, setup.env, timeout=900, cwd=str(setup.work))
    return phases(result.stdout, started, step, nodes * per_node, f"deepcam {config} {nodes}x{per_node}")


def measure(
    setup: Setup,
    configs: Sequence[str],
    sizes: Sequence[tuple[int, int]],
    problem: Problem,
    repetitions: int,
    failures: list[Failure],
    log: Callable[[str], None] = print,
) -> list[Sample]:
    nodes = max(n for n, _ in sizes)
    for config in configs:  # warm up: the page cache with torch (host and image), every node's storage
        try:
            run_once(setup, config, nodes, 1, WARM_UP)
        except (BenchError, subprocess.TimeoutExpired) as err:
            log(f"deepcam {config}: warm-up failed: {err}")
    samples = []
    for repetition in range(repetitions):
        for nodes, per_node in sizes:
            size = f"{nodes}x{per_node}"
            for config in alternating(configs, repetition):
                try:
                    result = run_once(setup, config, nodes, per_node, problem)
                except (BenchError, subprocess.TimeoutExpired) as err:
                    failures.append(Failure(BENCHMARK, config, size, repetition, str(err)))
                    log(f"deepcam {config:<12} {size} rep {repetition}: FAILED {err}")
                    continue
                for metric, value in zip(
                    [*PHASES, "step_seconds"],
                    (result.container_start, result.startup, result.loop, result.step),
                    strict=True,
                ):
                    samples.append(Sample(BENCHMARK, config, size, repetition, metric, value))
                log(
                    f"deepcam {config:<12} {size} rep {repetition}: container start {result.container_start:.2f} s, "
                    f"start-up {result.startup:.2f} s, loop {result.loop:.2f} s, step {result.step:.2f} s"
                )
    return samples
