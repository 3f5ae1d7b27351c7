"""A node dying in the middle of a 4-node podman-exec step, on the real stack: its slurmd and every
process of the node die at once (``dev/stack node-kill``: a power loss), then it boots again
(``dev/stack node-boot``). srun fails with Slurm's reason instead of hanging, the job ends NODE_FAIL,
neither the other nodes nor the rebooted one keep anything of the step (container, step directory,
mount, socket, monitor), and the next 4-node step runs on every node, the rebooted one included.

The test runs as the stack's user; the two node commands run as root through the sudo rule
dev/stack writes for exactly them (dev/stacklib/host.py)."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from jupyter_podman_hpc import stepsocket
from tests.helpers.commands import run
from tests.helpers.faults import REPO

pytestmark = [pytest.mark.faults, pytest.mark.integration]

STACK = REPO / "dev" / "stack"
TASKS_PER_NODE = 2


def node_power(command: str, node: str) -> None:
    """``dev/stack node-kill NODE`` or ``node-boot NODE``, as root through the stack's sudo rule."""
    run(["sudo", "-n", STACK, command, node], timeout=300)


@pytest.fixture
def dead_node(stack, hpc):
    """The node the test kills (the last one), booted again however the test ends and idle before
    the ``hpc`` fixture cleans every node. The step holds every node whole (the partition gives
    whole nodes), so no other job runs on it when it dies."""
    node = stack.nodes[-1]
    if run(["sudo", "-n", "-l", STACK, "node-kill", node], check=False).returncode != 0:
        pytest.fail(
            f"the stack's user may not run `{STACK} node-kill {node}` through sudo: "
            "run `dev/stack up` as root from this checkout (it writes the sudo rule)"
        )
    try:
        yield node
    finally:
        node_power("node-boot", node)  # a node that runs is left as it is


class Lines:
    """What a process writes to one of its pipes, read line by line as it comes."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._reader.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, count: int, prefix: str, timeout: float) -> list[str]:
        """Until ``count`` lines start with ``prefix``; those lines (fewer on timeout)."""

        def found() -> list[str]:
            return [line for line in self.lines if line.startswith(prefix)]

        with self._changed:
            self._changed.wait_for(lambda: len(found()) >= count, timeout)
            return found()

    def all(self) -> list[str]:
        """Every line, once the process has closed the pipe."""
        self._reader.join(10)
        return list(self.lines)


def step_fails_within(env) -> float:
    """How long srun may take to fail once a node is dead: srun learns it from slurmctld, which
    calls a node dead once it has not answered for SlurmdTimeout (the stack's: 30 s), checked
    at every ping (a third of it); then srun waits KillWait + 2 s for the step's other nodes."""
    config = run(["scontrol", "show", "config"], env=env).stdout
    settings = dict(line.split("=", 1) for line in config.splitlines() if " = " in line)
    seconds = {
        key.strip(): int(value.split()[0])
        for key, value in settings.items()
        if key.strip() in ("SlurmdTimeout", "KillWait")
    }
    return seconds["SlurmdTimeout"] * 4 / 3 + seconds["KillWait"] + 2 + 20  # 20 s for a loaded machine


def monitor_sockets(job: str, nodes) -> list[str]:
    """The nodes whose step monitor of the job's step 0 still listens: its abstract socket (the
    nodes share the host's network namespace, so /proc/net/unix lists every node's)."""
    wanted = {stepsocket.address_of(stepsocket.step_key(job, "0", node)).lstrip("\0"): node for node in nodes}
    with open("/proc/net/unix") as table:
        bound = {fields[7].lstrip("@") for fields in map(str.split, table) if len(fields) == 8}
    return sorted(node for address, node in wanted.items() if address in bound)


def job_state(env, job: str, timeout: float = 60) -> str:
    """The job's state and reason in Slurm's accounting once it has ended."""
    deadline = time.monotonic() + timeout
    while True:
        state = run(["sacct", "-X", "-n", "-P", "-j", job, "-o", "State,Reason,ExitCode"], env=env).stdout.strip()
        if state.split("|")[0] not in ("", "PENDING", "RUNNING", "REQUEUED") or time.monotonic() > deadline:
            return state
        time.sleep(1)


@pytest.mark.timeout(900)  # each srun may wait minutes for another user's job to free the nodes
def test_a_node_dying_mid_step_fails_the_step_and_job_and_boots_clean(hpc, stack, dead_node):
    began = time.monotonic()

    def phase(what: str) -> None:
        print(f"{time.monotonic() - began:5.1f} s  {what}")

    hpc("pull", stack.tiny_image)
    hpc.wipe_local_storage()  # the nodes read it from the squashed store, as compute nodes do
    nodes, ranks = len(stack.nodes), len(stack.nodes) * TASKS_PER_NODE
    step = subprocess.Popen(
        [
            "srun",
            f"-N{nodes}",
            f"--ntasks-per-node={TASKS_PER_NODE}",
            "-J",
            "faults-node-death",
            "podman-hpc",
            "shared-run",
            stack.tiny_image,
            "sh",
            "-c",
            'echo "up $SLURM_JOB_ID"; exec sleep 600',
        ],
        env=hpc.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = Lines(step.stdout), Lines(step.stderr)
    try:
        up = out.wait_for(ranks, "up ", timeout=300)  # the allocation may wait for another's job
        assert len(up) == ranks, (out.lines, err.lines)  # every rank runs in its node's container
        job, bound = up[0].split()[1], step_fails_within(hpc.env)
        phase(f"job {job}: {ranks} ranks run in their nodes' containers")
        assert monitor_sockets(job, stack.nodes) == sorted(stack.nodes)  # what the check below looks for
        node_power("node-kill", dead_node)
        killed = time.monotonic()
        try:
            step.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            pytest.fail(f"srun still runs {bound:.0f} s after {dead_node} died; it said: {err.lines}")
        failed_after = time.monotonic() - killed
    finally:
        if step.poll() is None:
            step.kill()
            step.wait()
    said = err.all()
    phase(f"srun exited {step.returncode}, {failed_after:.1f} s after {dead_node} died; the user saw:")
    print("\n".join(f"    {line}" for line in said))
    assert step.returncode != 0
    assert f"srun: error: Node failure on {dead_node}" in said, said
    # Slurm's lines only: no traceback or error of ours from the nodes whose step Slurm cancelled
    assert all(line.startswith(("srun: ", "slurmstepd-")) for line in said), said
    state = job_state(hpc.env, job)
    print(f"job {job} (state|reason|exit code): {state}")
    assert state.split("|")[0] == "NODE_FAIL", state

    node_power("node-boot", dead_node)
    phase(f"{dead_node} booted and idle")
    assert hpc.leftovers() == {}  # the other nodes removed their containers, the rebooted one has none
    assert monitor_sockets(job, stack.nodes) == []  # every node's step monitor has ended
    root = hpc.env["PODMANHPC_RUN_ROOT"]
    sockets = hpc.on_each_node("sh", "-c", f"find {root} -type s 2>/dev/null; true")
    assert {node: text for node, text in sockets.items() if text.strip()} == {}

    again = hpc.srun(
        f"-N{nodes}",
        f"--ntasks-per-node={TASKS_PER_NODE}",
        "podman-hpc",
        "shared-run",
        stack.tiny_image,
        "sh",
        "-c",
        'echo "$SLURMD_NODENAME"',
        timeout=600,
    )
    assert sorted(again.stdout.split()) == sorted(list(stack.nodes) * TASKS_PER_NODE), again
    phase("the next step ran on every node")
    assert hpc.leftovers() == {}
    phase("nothing left")
