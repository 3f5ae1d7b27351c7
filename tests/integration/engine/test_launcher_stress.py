"""Steps cancelled at every moment of their start: each node's monitor (podman-exec) or each
task's reaper (per-process) still removes what the step started, within seconds. (The 300
steps of mixed sizes, some cancelled, are in test_output_integrity.py, which also counts
every byte.)"""

import subprocess
import time

import pytest

from tests.helpers.launcher_steps import allocation, cancel_when_up

# moments after a step shows in squeue: before, while and after its tasks reach their node's monitor
CANCEL_DELAYS = (0.0, 0.2, 0.5, 1.0, 1.5)


# podman-exec: a monitor per node; per-process: a reaper per task, one container each (so fewer);
# --reuse: the job's container, which goes 1 s (its linger here) after a step has let go of it
MODES = {
    "podman-exec": (("shared-run",), 4),
    "per-process": (("run", "--rm"), 1),
    "podman-exec --reuse": (("shared-run", "--reuse"), 4),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_step_cancelled_at_any_moment_of_its_start_leaves_nothing_within_seconds(squashed_tiny, stack, mode):
    """Each node's monitor watches the step's slurmstepd: once the step has ended there, it removes
    the container even if a task never told it goodbye (killed before it connected, or its
    connection held open by a process the kill missed). Without that watch, a probe of this
    test on 2026-12-02 found the containers and step directories of the steps cancelled at
    0.5-1 s still there 33-39 s after srun returned.

    In per-process mode each task's reaper removes its container. A podman killed while it
    started the container is no proof that none will run: conmon starts it, and writes its pid
    file, after podman is gone (the 300-step test once found such a pid file, 2026-12-02).

    With --reuse, the monitor of each cancelled step lets go of the job's container, and it goes
    after the linger: also when the step was cancelled while its monitor held the starting lock."""
    hpc = squashed_tiny
    env = {**hpc.env, "PODMANHPC_SHARED_RUN_REUSE_LINGER": "1"}
    argv, per_node = MODES[mode]
    with allocation(stack, env) as job:
        for index, delay in enumerate(CANCEL_DELAYS):
            name = f"cancel-{index}"
            step = subprocess.Popen(
                [
                    "srun",
                    "--jobid",
                    job,
                    "--overlap",
                    "-J",
                    name,
                    f"-N{len(stack.nodes)}",
                    f"--ntasks-per-node={per_node}",
                    "podman-hpc",
                    *argv,
                    stack.tiny_image,
                    "sleep",
                    "60",
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            assert cancel_when_up(job, name, env, time.monotonic() + 60, settle=delay), f"step {name} never ran"
            assert step.wait(timeout=60) != 0
            # 10 s: far below the 60 s of the monitor's idle limit and of the ranks' sleep
            assert (name, hpc.leftovers(within=10, job=job)) == (name, {})
