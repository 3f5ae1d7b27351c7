"""EXAALT-like: LAMMPS running the classic Lennard-Jones melt, bare and in containers.

The input deck is LAMMPS's ``examples/melt/in.melt`` (fcc lattice at reduced
density 0.8442, LJ cutoff 2.5, NVE), with the box edge (lattice cells per
side) and the step count as parameters; rank 0 writes a dump four times per
run and the log to the shared scratch, which containers see through a bind
mount (``-v DIR:DIR -w DIR``). Strong scaling: one problem on 1, 2 and 4 nodes.

Configurations, every one under ``srun --mpi=pmix`` with Open MPI over TCP on
loopback (``common.MPI_ENV``):

- ``bare``: the host's ``lmp`` (Debian's ``lammps``);
- ``podman-exec``: ``podman-hpc shared-run --openmpi-pmix ... IMAGE lmp ...``
  (tasks join the node container's namespaces, the default);
- ``podman-exec --no-join``: the same, tasks entering it with ``podman exec``;
- ``per-process``: ``podman-hpc run --rm --openmpi-pmix ... IMAGE lmp ...``;

where IMAGE is the base image plus Debian's ``lammps`` (``Containerfile.lammps``,
the same package version as the host's), run from the squashed store.

Two metrics per run: ``loop_seconds``, LAMMPS's own "Loop time of X" (the time
stepping alone, what the application sees), and ``step_seconds``, the wall
time of the whole ``srun`` (allocation, container start, MPI start-up, input,
the run, output, teardown).

Tasks per node: 1. The machine has 2 cores shared by all four "nodes": one
task per node gives 1, 2 and 4 ranks, so the step from 1 to 2 nodes is real
strong scaling and 4 nodes oversubscribe the cores twice; 2 tasks per node
would oversubscribe every multi-node run 2-4 times, where Open MPI's busy
polling makes loop times mostly scheduler noise. Idle ranks yield their core
(``OMPI_MCA_mpi_yield_when_idle=1``, every configuration). All configurations
see the same oversubscription, so their comparison holds at every size; the
scaling itself past 2 nodes says nothing about the engine.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from common import (
    MPI_ENV,
    BenchError,
    Failure,
    PrivateStorage,
    Sample,
    alternating,
    ensure_image,
    package_version,
    timed,
    which,
)

BENCHMARK = "lammps"
CONFIGS = ["bare", "podman-exec", "podman-exec --no-join", "per-process"]
TASKS_PER_NODE = 1
FULL_NODES = (1, 2, 4)
SMOKE_NODES = (1, 2)
HERE = Path(__file__).resolve().parent
CONTAINERFILE = HERE / "Containerfile.lammps"

IN_MELT = """\
# 3d Lennard-Jones melt (LAMMPS examples/melt/in.melt), sized by -var cells N -var steps S

units           lj
atom_style      atomic

lattice         fcc 0.8442
region          box block 0 ${cells} 0 ${cells} 0 ${cells}
create_box      1 box
create_atoms    1 box
mass            1 1.0

velocity        all create 3.0 87287 loop geom

pair_style      lj/cut 2.5
pair_coeff      1 1 1.0 1.0 2.5

neighbor        0.3 bin
neigh_modify    every 20 delay 0 check no

fix             1 all nve

dump            id all atom ${dump_every} ${out}.dump
thermo          50
run             ${steps}
"""

# Idle ranks yield the core instead of busy polling: 4 ranks share 2 cores at 4 nodes (the
# containers get it too, like every OMPI_* variable). Without it the 4-node loop times here
# varied 7-29 s for the same run (5-8 s with it).
YIELD_ENV = {"OMPI_MCA_mpi_yield_when_idle": "1"}

LOOP_TIME = re.compile(r"^Loop time of ([0-9.eE+-]+) on (\d+) procs for (\d+) steps with (\d+) atoms", re.M)


@dataclass(frozen=True)
class Problem:
    cells: int  # lattice cells per box edge: 4 * cells**3 atoms
    steps: int

    @property
    def atoms(self) -> int:
        return 4 * self.cells**3

    def __str__(self) -> str:
        return f"{self.atoms} atoms, {self.steps} steps"


# 32,000 atoms: about 20 s of loop time for one rank on one core of this machine (quiet).
FULL = Problem(cells=20, steps=1000)
SMOKE = Problem(cells=5, steps=100)
WARM_UP = Problem(cells=5, steps=20)


@dataclass
class Setup:
    image: str
    work: Path
    env: dict[str, str]
    lmp: str


def prepare(base_image: str, work: Path, storage: PrivateStorage, log: Callable[[str], None] = print) -> Setup:
    """The host's lmp, the benchmark image in the squashed store, the input deck on the scratch;
    containers run with the nodes' ``storage``."""
    try:
        lmp = which("lmp")
    except BenchError:
        raise BenchError(
            "lmp is not on PATH: install Debian's lammps on the host "
            "(apt-get install --no-install-recommends lammps) for the bare-metal runs"
        )
    context = work / "lammps-context"  # the Containerfile needs no files: an empty build context
    context.mkdir(parents=True, exist_ok=True)
    image = ensure_image("lammps", CONTAINERFILE, context, base_image, log=log)
    directory = work / "lammps"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "in.melt").write_text(IN_MELT)
    return Setup(image, directory, {**storage.env(), **MPI_ENV, **YIELD_ENV}, lmp)


def describe(problem: Problem) -> str:
    version = package_version("lammps")
    return (
        f"LJ melt (in.melt), {problem}, strong scaling over nodes x {TASKS_PER_NODE} task per node; "
        f"Debian lammps {version} on the host and in the image; Open MPI over TCP on loopback, idle ranks "
        "yielding (4 nodes share the machine's 2 cores). "
        'loop seconds: LAMMPS\'s own "Loop time"; step seconds: wall time of the whole srun.'
    )


def command(setup: Setup, config: str, nodes: int, problem: Problem, out: str) -> list[str]:
    srun = ["srun", f"-N{nodes}", f"--ntasks-per-node={TASKS_PER_NODE}", "--mpi=pmix"]
    directory = str(setup.work)
    app = [
        "lmp",
        "-in",
        "in.melt",
        "-log",
        f"{out}.log",
        "-var",
        "cells",
        str(problem.cells),
        "-var",
        "steps",
        str(problem.steps),
        "-var",
        "dump_every",
        str(max(problem.steps // 4, 1)),
        "-var",
        "out",
        out,
    ]
    mount = ["--openmpi-pmix", "-v", f"{directory}:{directory}", "-w", directory]
    if config == "bare":
        return [*srun, setup.lmp, *app[1:]]
    if config == "podman-exec":
        return [*srun, "podman-hpc", "shared-run", *mount, setup.image, *app]
    if config == "podman-exec --no-join":
        return [*srun, "podman-hpc", "shared-run", "--no-join", *mount, setup.image, *app]
    if config == "per-process":
        return [*srun, "podman-hpc", "run", "--rm", *mount, setup.image, *app]
    raise BenchError(f"unknown lammps configuration: {config}")


def run_once(setup: Setup, config: str, nodes: int, problem: Problem, tag: str) -> tuple[float, float]:
    """(wall seconds of the step, LAMMPS's loop time) of one run, which must complete."""
    out = f"run-{tag}"
    try:
        seconds, result = timed(
            command(setup, config, nodes, problem, out), setup.env, timeout=1800, cwd=str(setup.work)
        )
        found = LOOP_TIME.search(result.stdout)
        if found is None:
            tail = " | ".join(result.stdout.strip().splitlines()[-3:])
            raise BenchError(f"lammps {config} on {nodes} nodes printed no loop time: {tail}")
        loop, procs, steps, atoms = float(found.group(1)), int(found.group(2)), int(found.group(3)), int(found.group(4))
        if (procs, steps, atoms) != (nodes * TASKS_PER_NODE, problem.steps, problem.atoms):
            raise BenchError(
                f"lammps {config} on {nodes} nodes ran {procs} procs, {steps} steps, {atoms} atoms; "
                f"expected {nodes * TASKS_PER_NODE}, {problem.steps}, {problem.atoms}"
            )
        return seconds, loop
    finally:
        for suffix in (".log", ".dump"):
            (setup.work / f"{out}{suffix}").unlink(missing_ok=True)


def measure(
    setup: Setup,
    configs: Sequence[str],
    nodes_list: Sequence[int],
    problem: Problem,
    repetitions: int,
    failures: list[Failure],
    log: Callable[[str], None] = print,
) -> list[Sample]:
    for config in configs:  # warm up: the page cache with the image and lmp, every node's storage
        try:
            run_once(setup, config, max(nodes_list), WARM_UP, f"warm-{config.replace(' ', '')}")
        except BenchError as err:
            log(f"lammps {config}: warm-up failed: {err}")
    samples = []
    for repetition in range(repetitions):
        for nodes in nodes_list:
            size = f"{nodes}x{TASKS_PER_NODE}"
            for config in alternating(configs, repetition):
                tag = f"{config.replace(' ', '')}-{nodes}-{repetition}"
                try:
                    seconds, loop = run_once(setup, config, nodes, problem, tag)
                except (BenchError, subprocess.TimeoutExpired) as err:
                    failures.append(Failure(BENCHMARK, config, size, repetition, str(err)))
                    log(f"lammps {config:<20} {size} rep {repetition}: FAILED {err}")
                    continue
                samples.append(Sample(BENCHMARK, config, size, repetition, "loop_seconds", loop))
                samples.append(Sample(BENCHMARK, config, size, repetition, "step_seconds", seconds))
                log(f"lammps {config:<20} {size} rep {repetition}: loop {loop:.2f} s, step {seconds:.2f} s")
    return samples
