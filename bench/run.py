#!/usr/bin/env python3
"""Run the benchmarks on the cluster-in-a-box and write bench/results/<date>-<host>.{md,csv,*.png}.

    bench/run.py                   the full comparison (make bench)
    bench/run.py --smoke           one repetition at the smallest sizes (make bench-smoke)
    bench/run.py --only lammps     some of: launch steps scale lammps pynamic deepcam readpath squash kernel cluster

Run as the stack user with the stack's environment (dev/as-user does it).
Images the application benchmarks need are built once and kept squashed in
$SCRATCH/bench/images; generated workloads in $SCRATCH/bench/pynamic.
Exits 1 when a benchmark or a run failed (the results file lists them).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cluster
import deepcam
import kernel
import lammps
import launch
import pynamic
import readpath
import report
import scale
import squash
import steps
from common import BenchError, Failure, PrivateStorage, Sample, image_store, machine, remove_tree

BENCHMARKS = ["launch", "steps", "scale", "lammps", "pynamic", "deepcam", "readpath", "squash", "kernel", "cluster"]
# 1x16 and 4x16 show what each added rank costs (the nodes declare 16 CPUs for them)
FULL_SIZES = [(n, k) for n in (1, 2, 4) for k in (1, 2, 4, 8)] + [(1, 16), (4, 16)]
SMOKE_SIZES = [(1, 1)]
LAUNCH_CONFIGS = ["bare", "podman-exec", "podman-exec --no-join", "per-process", "1.2.2 shared-run", "1.2.2 run"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="one repetition, smallest sizes")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--only", nargs="*", choices=BENCHMARKS, default=BENCHMARKS, help="benchmarks to run")
    parser.add_argument("--image", default=None, help="image to launch (default: the stack's base image)")
    parser.add_argument("--output", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    try:  # find out now, not after an hour of measuring
        args.output.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        parser.error(f"cannot create the results directory {args.output}: {err.strerror}")
    if not os.access(args.output, os.W_OK):
        parser.error(f"cannot write results to {args.output}: make it writable for this user or pass --output DIR")

    # scancel, timeout, kill: end like Ctrl-C, so the clean-up below runs
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.stdout.reconfigure(line_buffering=True)  # progress shows as it happens, also in a log file
    repetitions = 1 if args.smoke else args.repetitions
    sizes = SMOKE_SIZES if args.smoke else FULL_SIZES
    base = os.environ["STACK_BASE_IMAGE"]  # what the application and kernel benchmarks build on
    image = args.image or (os.environ["STACK_TINY_IMAGE"] if args.smoke else base)
    work = Path(os.environ["SCRATCH"]) / "bench" / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True)
    samples: list[Sample] = []
    failures: list[Failure] = []
    notes: dict[str, str] = {}
    # the application benchmarks' containers: a node-local storage of their own on every node
    storage = PrivateStorage(work.name)

    def attempt(name: str, run) -> None:
        """Run one benchmark; a benchmark that cannot run is reported, the others still run."""
        if name not in args.only:
            return
        print(f"== {name}", flush=True)
        started = time.monotonic()
        try:
            run()
        except (BenchError, subprocess.SubprocessError, OSError) as err:
            failures.append(Failure(name, "-", "-", -1, f"{type(err).__name__}: {err}"))
            print(f"{name}: FAILED {err}", flush=True)
        print(f"== {name}: {time.monotonic() - started:.0f} s", flush=True)  # where a run's time goes

    try:
        prepared: list[launch.Setup] = []

        def launch_setup() -> launch.Setup:
            """The launched image squashed for both tools (shared by launch and squash)."""
            if not prepared:
                prepared.append(launch.prepare(image, work, with_peer=True))
            return prepared[0]

        def run_launch() -> None:
            setup = launch_setup()
            notes["launch"] = (
                f"`{image}` running `true` under `srun -N<nodes> --ntasks-per-node=<tasks>`; "
                "step seconds: wall time of the whole srun."
            )
            samples.extend(launch.measure(setup, LAUNCH_CONFIGS, sizes, repetitions))

        def run_steps() -> None:
            setup = launch_setup()
            notes["steps"] = (
                f"`{image}` running `true` as a step of one allocation (`srun --jobid J --overlap "
                "-N<nodes> --ntasks-per-node=<tasks>`); `--reuse` steps run in the containers the "
                "job's earlier steps left. Step seconds: wall time of the whole srun."
            )
            samples.extend(
                steps.measure(image, setup.ours_env, steps.SMOKE_SIZES if args.smoke else steps.FULL_SIZES, repetitions)
            )

        def run_scale() -> None:
            setup = launch_setup()
            counts = scale.node_counts(len(os.environ["STACK_NODES"].split()), args.smoke)
            tasks = scale.SMOKE_TASKS if args.smoke else scale.TASKS
            notes["scale"] = (
                f"`{image}` running `true` as steps of one allocation, on n1..nN; the stack had "
                f"{len(os.environ['STACK_NODES'].split())} nodes. Node CPU: everything the step ran "
                "on a node (its cpuacct cgroup), mean over the step's nodes; login CPU: srun's; "
                "ctld CPU: slurmctld's during the step. In `podman-exec, nodes in turn`, node i starts "
                f"{scale.TURN_SECONDS} s x i after node 0 (`sleep` in `sh`), so no two nodes' work "
                "shares the cores."
            )
            samples.extend(
                scale.measure(
                    scale.configurations(launch.configurations(setup, scale.LAUNCH_CONFIGS)),
                    setup.ours_env,
                    counts,
                    tasks,
                    repetitions,
                )
            )
            readings = [scale.kernel_reading(base)]
            if not args.smoke:
                readings.append(
                    scale.Reading(
                        "import torch", deepcam.prepare(base, work, storage).image, image_store(), "import torch"
                    )
                )
            notes["scale-reads"] = (
                "A job's first step on a fresh node, then on a node that checked the squash "
                "file before (its copy gone), per read path and workload: MiB of the squash "
                "file the node read, and the step's seconds. Workloads: "
                + "; ".join(f"{r.name}: `{r.image}`, python3 -c '{r.code}'" for r in readings)
            )
            samples.extend(scale.measure_reads(readings, repetitions))

        def run_lammps() -> None:
            problem = lammps.SMOKE if args.smoke else lammps.FULL
            nodes = lammps.SMOKE_NODES if args.smoke else lammps.FULL_NODES
            lammps_setup = lammps.prepare(base, work, storage)
            notes["lammps"] = lammps.describe(problem)
            samples.extend(lammps.measure(lammps_setup, lammps.CONFIGS, nodes, problem, repetitions, failures))

        def run_pynamic() -> None:
            workload = pynamic.SMOKE if args.smoke else pynamic.FULL
            pynamic_setup = pynamic.prepare(base, workload, storage)
            notes["pynamic"] = pynamic.describe(pynamic_setup)
            samples.extend(
                pynamic.measure(
                    pynamic_setup,
                    pynamic.CONFIGS,
                    pynamic.VARIANTS,
                    pynamic.SMOKE_SIZES if args.smoke else pynamic.FULL_SIZES,
                    repetitions,
                    failures,
                )
            )

        def run_deepcam() -> None:
            problem = deepcam.SMOKE if args.smoke else deepcam.FULL
            deepcam_setup = deepcam.prepare(base, work, storage)
            notes["deepcam"] = deepcam.describe(problem)
            samples.extend(
                deepcam.measure(
                    deepcam_setup,
                    deepcam.CONFIGS,
                    deepcam.SMOKE_SIZES if args.smoke else deepcam.FULL_SIZES,
                    problem,
                    repetitions,
                    failures,
                )
            )

        def run_readpath() -> None:
            notes["readpath"] = (
                "The base image's python3, chrooted, importing what a kernel needs through each "
                "read path; baseline: the same files as a plain directory on the node's disk."
            )
            samples.extend(readpath.measure(base, work / "readpath", repetitions))

        def run_squash() -> None:
            setup = launch_setup()
            notes["squash"] = f"Squashing `{image}` (lz4) into an empty store."
            samples.extend(squash.measure(setup, work / "squash", repetitions))

        def run_kernel() -> None:
            notes["kernel"] = (
                f"Launch to the first kernel_info reply; the container kernel runs `{base}` "
                "from the squashed store with a node-local storage that never pulled it, and (login row) "
                "after a pull on the same host."
            )
            samples.extend(kernel.measure(base, work, repetitions, failures))

        def run_cluster() -> None:
            notes["cluster"] = (
                f"An interactive cluster of {cluster.NODES} x {cluster.TASKS} IPython Parallel engines "
                f"in `{base}` (openmpi-pmix): from the start call to all engines registered, "
                "against the same job's bare srun and the same engines bare."
            )
            samples.extend(cluster.measure(base, work, repetitions, failures))

        for name, run in (
            ("launch", run_launch),
            ("steps", run_steps),
            ("scale", run_scale),
            ("lammps", run_lammps),
            ("pynamic", run_pynamic),
            ("deepcam", run_deepcam),
            ("readpath", run_readpath),
            ("squash", run_squash),
            ("kernel", run_kernel),
            ("cluster", run_cluster),
        ):
            attempt(name, run)
    finally:
        if {"lammps", "pynamic", "deepcam"} & set(args.only):
            storage.remove()
        remove_tree(work)
    stem = f"{dt.date.today().isoformat()}-{socket.gethostname()}{'-smoke' if args.smoke else ''}"
    path = report.write(samples, machine(), args.output, stem, smoke=args.smoke, notes=notes, failures=failures)
    print(f"results: {path}")
    if failures:
        print(f"{len(failures)} failure(s): see the results file", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
