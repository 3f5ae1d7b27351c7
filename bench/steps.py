"""A job's later steps: wall time of a step running `true` inside one allocation.

Configurations, each a step of the same job (`srun --jobid J --overlap -N<n> --ntasks-per-node=<k>`):
bare srun; podman-exec, which starts and removes its node containers every step; podman-exec with
`--reuse`, whose steps run in the containers the job's earlier steps left on its nodes (a warm-up step
started them; a job's first `--reuse` step costs what a podman-exec step costs); and per-process
(`podman-hpc run --rm`, a container a task). Steps of one allocation, unlike the launch benchmark's
jobs, wait for no scheduling. Repetitions alternate the configurations so that drift on the machine
spreads over all of them.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

from common import BenchError, Sample, alternating, timed

BENCHMARK = "steps"
CONFIGS = ["bare", "podman-exec", "podman-exec --reuse", "per-process"]
FULL_SIZES = [(1, 1), (4, 1), (4, 8)]
SMOKE_SIZES = [(1, 1)]
LINGER = 10  # seconds a reused container waits for the next step: longer than the gaps between its steps


def command(config: str, image: str, job: str, nodes: int, per_node: int) -> list[str]:
    """The step of ``config`` in allocation ``job``."""
    step = ["srun", "--jobid", job, "--overlap", f"-N{nodes}", f"--ntasks-per-node={per_node}"]
    if config == "bare":
        return [*step, "true"]
    if config == "per-process":
        return [*step, "podman-hpc", "run", "--rm", image, "true"]
    reuse = ["--reuse"] if config == "podman-exec --reuse" else []
    return [*step, "podman-hpc", "shared-run", *reuse, image, "true"]


def measure(
    image: str,
    env: Mapping[str, str],
    sizes: Sequence[tuple[int, int]],
    repetitions: int,
    log: Callable[[str], None] = print,
) -> list[Sample]:
    """Step seconds of every configuration and size, in one allocation of the largest node count."""
    env = {**env, "PODMANHPC_SHARED_RUN_REUSE_LINGER": str(LINGER)}
    job = allocate(max(nodes for nodes, _ in sizes), env)
    try:
        for nodes, per_node in sizes:  # warm up: every node's storage, and the containers to reuse
            for config in CONFIGS:
                timed(command(config, image, job, nodes, per_node), env)
        samples = []
        for repetition in range(repetitions):
            for nodes, per_node in sizes:
                for config in alternating(CONFIGS, repetition):
                    seconds, _ = timed(command(config, image, job, nodes, per_node), env)
                    samples.append(
                        Sample(BENCHMARK, config, f"{nodes}x{per_node}", repetition, "step_seconds", seconds)
                    )
                    log(f"steps {config:<20} {nodes}x{per_node} rep {repetition}: {seconds:.2f} s")
        return samples
    finally:
        subprocess.run(["scancel", job], env=env, capture_output=True)
        time.sleep(LINGER + 5)  # the reused containers go after the linger, before their store does


def allocate(nodes: int, env: Mapping[str, str], timeout: float = 300) -> str:
    """A running job holding ``nodes`` whole nodes, for steps to run in; its id."""
    _, submitted = timed(
        [
            "sbatch",
            "--parsable",
            f"-N{nodes}",
            "--exclusive",
            "-t",
            "60",
            "-J",
            "bench-steps",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 3600",
        ],
        env,
    )
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], env=env, capture_output=True, text=True
        ).stdout.strip()
        if state == "RUNNING":
            return job
        time.sleep(0.5)
    subprocess.run(["scancel", job], env=env, capture_output=True)
    raise BenchError(f"the allocation for the steps benchmark did not start within {timeout:.0f} s")
