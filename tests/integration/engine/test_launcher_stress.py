"""Many short podman-exec steps of mixed sizes, some cancelled while they run, at the same
time in one allocation: afterwards no container, step directory, socket, mount or monitor
remains on any node, and no monitor had to give up removing its container."""

import concurrent.futures
import itertools
import subprocess
import time
from pathlib import Path

import pytest

from jupyter_podman_hpc.engine.stepmonitor import MONITOR_LOG
from tests.conftest import run
from tests.integration.engine.conftest import allocation

STEPS = 200
AT_ONCE = 4
# nodes x tasks per node; the big ones are rarer, so the run stays short on 2 cores
SIZES = [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (1, 4), (4, 2), (2, 1), (1, 1), (4, 1),
         (1, 8), (2, 4), (1, 1), (4, 8), (2, 2), (4, 1), (1, 2), (2, 8), (1, 1), (4, 4)]
CANCEL_EVERY = 10


def cancel_when_up(job, name, env, deadline, settle=1.5):
    """scancel the step called ``name`` ``settle`` seconds after it shows in squeue (by default,
    once its monitor has started the containers); whether it was seen running."""
    while time.monotonic() < deadline:
        steps = run(["squeue", "-h", "-s", "-j", job, "-o", "%i %j"], env=env, check=False).stdout.split("\n")
        found = [line.split()[0] for line in steps if line.endswith(f" {name}")]
        if found:
            time.sleep(settle)
            run(["scancel", found[0]], env=env, check=False)
            return True
        time.sleep(0.3)
    return False


@pytest.mark.timeout(1500)  # 200 steps: minutes on a quiet machine, more under load
def test_200_mixed_steps_some_cancelled_leave_nothing_behind(squashed_tiny, stack):
    hpc = squashed_tiny
    env = hpc.env
    with allocation(stack, env) as job:
        sizes = itertools.cycle(SIZES)

        def step(index):
            nodes, per_node = next(sizes)
            cancelled = index % CANCEL_EVERY == CANCEL_EVERY - 1
            mode = [] if index % 2 else ["--no-join"]
            name = f"stress-{index}"
            command = ["sleep", "60"] if cancelled else ["true"]
            argv = ["srun", "--jobid", job, "--overlap", "-J", name, f"-N{nodes}", f"--ntasks-per-node={per_node}",
                    "podman-hpc", "shared-run", *mode, stack.tiny_image, *command]
            process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if cancelled:
                assert cancel_when_up(job, name, env, time.monotonic() + 60), f"step {name} never ran"
            _, stderr = process.communicate(timeout=180)
            return index, cancelled, process.returncode, stderr

        with concurrent.futures.ThreadPoolExecutor(AT_ONCE) as pool:
            results = list(pool.map(step, range(STEPS)))
        failed = [(i, code, err[-300:]) for i, cancelled, code, err in results if not cancelled and code != 0]
        assert failed == []
        assert all(code != 0 for _, cancelled, code, _ in results if cancelled)  # really cancelled mid-run
    root = env["PODMANHPC_RUN_ROOT"]
    script = ('podman-hpc ps -a --format "container {{.Names}}"; '
              f'find {root} -type s | sed "s/^/socket /"; '
              f'cat {root}/shared-run-monitor.log 2>/dev/null | grep -i "could not be removed" | sed "s/^/gave up /"; true')
    deadline = time.monotonic() + 60  # monitors remove their containers after the step's tasks end
    try:
        while True:
            remaining = {**hpc.leftovers(within=0),
                         **{n: t for n, t in hpc.on_each_node("sh", "-c", script).items() if t.strip()}}
            if not remaining or time.monotonic() > deadline:
                break
            time.sleep(2)
        left = (remaining, monitors_of(root))
        if left != ({}, []):  # what the monitors said and are doing, while it is there
            for node, text in hpc.on_each_node("sh", "-c", f"tail -n 30 {root}/{MONITOR_LOG}; "
                                               f"ls -la {root}/shared-run/*; true").items():
                print(f"--- {node}\n{text}")
            for pid, cmdline in left[1]:
                print(pid, Path(f"/proc/{pid}/wchan").read_text() if Path(f"/proc/{pid}/wchan").exists() else "",
                      cmdline)
        assert left == ({}, [])
    finally:  # the store is the session's: what this test left must not fail the next tests' checks
        hpc.on_each_node("sh", "-c", 'podman-hpc rm --all --force --time 0 >/dev/null 2>&1; '
                         f'rm -rf {root}/shared-run/*; true')


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


# podman's rootless pause process holds the user's namespaces for every later podman call on
# the node; it inherits the environment of whichever podman call started it, maybe this test's
PODMAN_PAUSE = "catatonit -P "


def monitors_of(run_root):
    """This user's processes that work for the test's run root (monitors, podman, conmon)."""
    marker = f"PODMANHPC_RUN_ROOT={run_root}".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if marker in (proc / "environ").read_bytes().split(b"\0"):
                found.append((proc.name, (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except OSError:
            pass
    return [(pid, cmdline) for pid, cmdline in found if cmdline != PODMAN_PAUSE]
