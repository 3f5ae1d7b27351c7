"""What the engine's integration tests share."""

import contextlib
import time

from tests.conftest import run


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
    job = run(["sbatch", "--parsable", f"-N{len(stack.nodes)}", "-o", "/dev/null", "--wrap", "sleep 1800"],
              env=env).stdout.strip()
    try:
        wait_running(job, env)
        yield job
    finally:
        run(["scancel", job], env=env, check=False)
