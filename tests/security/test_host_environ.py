"""An image under the MPI modules (``--pid=host``) reads the environment of the host processes it sees.

The attacker is code in the image: each rank reads ``/proc/*/environ`` of every process on its
node. The step runs with a variable of the job that was not passed with ``-e`` (as a batch job
holds ``JUPYTERHUB_API_TOKEN``): no process the ranks can read may show it, neither ours (the
tasks, a joined task's waiting parent, the step monitor, the per-process reaper, podman, conmon,
the mount program) nor srun. The normal flow: a variable passed with ``-e NAME`` is in the
container, in every mode.
"""

import dataclasses
import textwrap
import uuid

import pytest

from tests.helpers.commands import run

KEPT_OUT = "JPH_KEPT_OUT"  # in the tasks' environment, never passed in
PASSED = "JPH_PASSED_IN"  # passed with -e NAME: podman takes its value from its own environment

# In every rank: each readable environment that holds KEPT_OUT, with its process's command line
# (readable whatever the process), then how many host processes of podman-hpc it sees (the step's
# tasks at least: the attack is in reach), then the rank's own view of PASSED.
PROBE = textwrap.dedent(f"""\
    for proc in /proc/[0-9]*; do
        if tr '\\0' '\\n' < "$proc/environ" 2>/dev/null | grep -q '^{KEPT_OUT}='; then
            echo "holds ${{proc#/proc/}}: $(tr '\\0' ' ' < "$proc/cmdline" | cut -c1-150)"
        fi
    done
    echo "sees $(cat /proc/[0-9]*/comm 2>/dev/null | grep -c '^podman-hpc$')"
    echo "rank $SLURM_PROCID passed=${PASSED}"
    """)

MODES = {
    "podman-exec, joined": ["shared-run"],
    "podman-exec, podman exec": ["shared-run", "--no-join"],
    "per-process": ["run", "--rm"],
}


@pytest.mark.parametrize("mode", list(MODES))
def test_no_host_process_of_ours_shows_the_jobs_environment_to_the_image(squashed_tiny, stack, mode):
    hpc = squashed_tiny
    env = {**hpc.env, KEPT_OUT: f"kept-out-{uuid.uuid4().hex}", PASSED: f"passed-{uuid.uuid4().hex[:8]}"}
    result = run(
        [
            "srun",
            "--mpi=pmix",
            "-N2",
            "-n4",
            "podman-hpc",
            *MODES[mode],
            "--openmpi-pmix",
            "-e",
            PASSED,
            stack.tiny_image,
            "sh",
            "-c",
            PROBE,
        ],
        env=env,
        timeout=300,
    )
    lines = result.stdout.splitlines()
    # the normal flow: every rank ran in its container, with the variable passed in
    assert sorted(line for line in lines if line.startswith("rank ")) == [
        f"rank {rank} passed={env[PASSED]}" for rank in range(4)
    ], result.stdout + result.stderr
    # the attack: every rank sees the step's tasks on the host, and no environment it could read
    # holds the job's variable
    sees = [int(line.split()[1]) for line in lines if line.startswith("sees ")]
    assert len(sees) == 4 and min(sees) >= 2, result.stdout
    assert [line for line in lines if line.startswith("holds ")] == []
    assert hpc.leftovers() == {}


def test_host_pid_with_ptrace_is_refused_and_host_pid_alone_still_runs(squashed_tiny, stack):
    """--pid=host with SYS_PTRACE would open every host process of the user's on the node to the image
    (podman's, the mount program's and the pause process's environment, and ptrace): refused in one line,
    nothing started. --pid=host alone (the MPI modules' shape) runs, and sees the host's processes."""
    hpc = squashed_tiny
    hpc_kept = dataclasses.replace(hpc, env={**hpc.env, KEPT_OUT: f"kept-out-{uuid.uuid4().hex}"})
    for ptrace in (["--cap-add=SYS_PTRACE"], ["--privileged"], ["--cap-add", "all"]):
        refused = hpc_kept("run", "--rm", "--pid=host", *ptrace, stack.tiny_image, "sh", "-c", PROBE, check=False)
        assert refused.returncode == 125, (ptrace, refused.stdout, refused.stderr)
        assert refused.stderr.strip().startswith("Error: --pid=host with SYS_PTRACE"), refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and refused.stdout == ""
    assert hpc("ps", "-a", "--format", "{{.Names}}").stdout.strip() == ""  # nothing was started
    alone = hpc_kept("run", "--rm", "--pid=host", stack.tiny_image, "sh", "-c", PROBE)
    assert [line for line in alone.stdout.splitlines() if line.startswith("holds ")] == []
    assert hpc.leftovers() == {}
