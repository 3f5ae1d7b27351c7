"""Steps cancelled at every moment of their start: each node's monitor still removes what the
step started, within seconds. (The 300 steps of mixed sizes, some cancelled, are in
test_output_integrity.py, which also counts every byte.)"""

import subprocess
import time

from tests.integration.engine.conftest import allocation, cancel_when_up


# moments after a step shows in squeue: before, while and after its tasks reach their node's monitor
CANCEL_DELAYS = (0.0, 0.2, 0.5, 1.0, 1.5)


def test_a_step_cancelled_at_any_moment_of_its_start_leaves_nothing_within_seconds(squashed_tiny, stack):
    """Each node's monitor watches the step's slurmstepd: once the step has ended there, it removes
    the container even if a task never told it goodbye (killed before it connected, or its
    connection held open by a process the kill missed). Without that watch, a probe of this
    test on 2026-12-02 found the containers and step directories of the steps cancelled at
    0.5-1 s still there 33-39 s after srun returned."""
    hpc = squashed_tiny
    env = hpc.env
    with allocation(stack, env) as job:
        for index, delay in enumerate(CANCEL_DELAYS):
            name = f"cancel-{index}"
            step = subprocess.Popen(["srun", "--jobid", job, "--overlap", "-J", name, f"-N{len(stack.nodes)}",
                                     "--ntasks-per-node=4", "podman-hpc", "shared-run", stack.tiny_image,
                                     "sleep", "60"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            assert cancel_when_up(job, name, env, time.monotonic() + 60, settle=delay), f"step {name} never ran"
            assert step.wait(timeout=60) != 0
            # 10 s: far below the 60 s of the monitor's idle limit and of the ranks' sleep
            assert (name, hpc.leftovers(within=10, job=job)) == (name, {})
