"""A job's steps sharing its node containers (``shared-run --reuse``) on the 4-node cluster.

In one 4-node job: a second step runs in the first step's containers (it sees
the first step's files), two concurrent steps share them too, a step with
other options and a step without ``--reuse`` get their own. After the job,
and after a job cancelled in the middle of a step, nothing is left once the
linger (5 s here) has passed.
"""

import time

import pytest

from tests.helpers.commands import run

pytestmark = pytest.mark.slow

LINGER = "5"
# each rank: its node, step, the container it runs in (pid namespace @ start of its pid 1) and the
# marks steps left in the container's root; then its own step's mark
REPORT = (
    'echo "$SLURMD_NODENAME $SLURM_STEP_ID $(readlink /proc/self/ns/pid)@$(cut -d" " -f22 /proc/1/stat) '
    '$(ls / | grep ^mark- | tr "\\n" ,)"; touch /mark-$SLURM_STEP_ID'
)


def containers(path) -> dict[str, tuple[set, set]]:
    """Per node: the containers its ranks ran in, and the marks of earlier steps they saw."""
    found: dict[str, tuple[set, set]] = {}
    for line in path.read_text().splitlines():
        node, step, container, *marks = line.split()
        seen = found.setdefault(node, (set(), set()))
        seen[0].add(container)
        seen[1].update(mark for mark in ",".join(marks).split(",") if mark and mark != f"mark-{step}")
    return found


def test_a_jobs_steps_share_its_node_containers_and_nothing_outlives_the_linger(squashed_tiny, stack):
    hpc = squashed_tiny
    image, out = stack.tiny_image, hpc.work
    reuse = "podman-hpc shared-run --reuse"
    script = out / "steps.sh"
    script.write_text(f"""#!/bin/sh
srun -N4 -n8 {reuse} {image} sh -c '{REPORT}' > {out}/first.out
srun -N4 -n8 {reuse} {image} sh -c '{REPORT}' > {out}/second.out
srun --overlap -N4 -n8 {reuse} {image} sh -c 'sleep 1; {REPORT}' > {out}/together1.out &
srun --overlap -N4 -n8 {reuse} {image} sh -c 'sleep 1; {REPORT}' > {out}/together2.out &
wait
srun -N4 -n8 {reuse} -e OTHER=1 {image} sh -c '{REPORT}' > {out}/other.out
srun -N4 -n8 podman-hpc shared-run {image} sh -c '{REPORT}' > {out}/alone.out
""")
    env = {**hpc.env, "PODMANHPC_SHARED_RUN_REUSE_LINGER": LINGER}
    run(["sbatch", "--wait", "-N4", "-t", "10", "-o", out / "job.out", script], env=env, timeout=300)
    first, second = containers(out / "first.out"), containers(out / "second.out")
    assert sorted(first) == list(stack.nodes), (out / "job.out").read_text()
    for node, (used, marks) in first.items():
        assert len(used) == 1 and not marks  # one container a node, new
        assert second[node][0] == used  # the second step runs in it
        assert second[node][1] == {"mark-0"}  # and sees what the first left
        for together in ("together1.out", "together2.out"):
            assert containers(out / together)[node][0] == used
        other, alone = containers(out / "other.out")[node], containers(out / "alone.out")[node]
        assert len(other[0]) == 1 and other[0] != used and not other[1]  # other options: its own
        assert len(alone[0]) == 1 and alone[0] != used and not alone[1]  # no --reuse: its own
    assert hpc.leftovers(within=float(LINGER) + 30) == {}


def test_a_job_cancelled_in_a_shared_step_leaves_nothing_after_the_linger(squashed_tiny, stack):
    hpc = squashed_tiny
    script = hpc.work / "cancelled.sh"
    script.write_text(f"""#!/bin/sh
srun -N4 -n8 podman-hpc shared-run --reuse {stack.tiny_image} true
srun -N4 -n8 podman-hpc shared-run --reuse {stack.tiny_image} sh -c 'echo started; sleep 300'
""")
    env = {**hpc.env, "PODMANHPC_SHARED_RUN_REUSE_LINGER": LINGER}
    job = run(
        ["sbatch", "--parsable", "-N4", "-t", "10", "-o", hpc.work / "cancelled.out", script], env=env
    ).stdout.strip()
    try:
        # every rank's line: the first one's appearing says nothing of the other seven's
        deadline = time.monotonic() + 120
        while _text(hpc.work / "cancelled.out").count("started") < 8 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _text(hpc.work / "cancelled.out").count("started") == 8, _text(hpc.work / "cancelled.out")
    finally:
        run(["scancel", job], env=env)  # a failed wait must not hold the 4 nodes for the next tests
    deadline = time.monotonic() + 60
    while (
        job in run(["squeue", "-h", "-j", job, "-o", "%i"], env=env, check=False).stdout.split()
        and time.monotonic() < deadline
    ):
        time.sleep(0.5)
    assert hpc.leftovers(within=float(LINGER) + 30) == {}


def _text(path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""
