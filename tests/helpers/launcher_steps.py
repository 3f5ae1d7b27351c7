"""What the launcher's stack tests share: a podman that writes down its calls, a job holding every
node, a step cancelled once it is up, and the processes that work for a test's run root."""

import contextlib
import time
from pathlib import Path

from tests.helpers.commands import run


def recording_podman(hpc, name):
    """A podman that writes down its arguments before it runs: (its path, the list's path)."""
    calls = hpc.work / f"{name}-calls"
    calls.touch()
    wrapper = hpc.work / f"{name}-podman"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec podman "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper), calls


def wait_running(job, env, timeout=300):  # generous: another job may hold the nodes a while
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = run(["squeue", "-h", "-j", job, "-o", "%T"], env=env, check=False).stdout.strip()
        if state == "RUNNING":
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job} did not start: {state}")


@contextlib.contextmanager
def allocation(stack, env):
    """A job holding every node (its id) for the steps of a test, cancelled however the test ends."""
    job = run(
        ["sbatch", "--parsable", f"-N{len(stack.nodes)}", "-o", "/dev/null", "--wrap", "sleep 1800"], env=env
    ).stdout.strip()
    try:
        wait_running(job, env)
        yield job
    finally:
        run(["scancel", job], env=env, check=False)


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
