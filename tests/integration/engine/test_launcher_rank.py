"""The rank path: a shared-run task that is not its node's first never loads the CLI, the
configuration or the modules; the step monitor hands it its plan over the step's socket."""

from tests.helpers.commands import run


def cli_imports(stderr):
    """Task numbers (srun --label) whose podman-hpc imported the CLI."""
    return {
        line.split(":", 1)[0].strip()
        for line in stderr.splitlines()
        if line.rstrip().endswith("jupyter_podman_hpc.cli")
    }


def test_only_the_first_task_of_each_node_loads_the_cli(squashed_tiny, stack):
    hpc = squashed_tiny
    result = run(
        [
            "srun",
            "--label",
            "-N2",
            "--ntasks-per-node=4",
            "podman-hpc",
            "shared-run",
            "--join",
            stack.tiny_image,
            "sh",
            "-c",
            'echo "$SLURM_PROCID $(readlink /proc/1/ns/pid)"',
        ],
        env={**hpc.env, "PYTHONPROFILEIMPORTTIME": "1"},
        timeout=300,
    )
    ranks = dict(line.split(": ", 1)[1].split() for line in result.stdout.splitlines() if ": " in line)
    assert sorted(ranks, key=int) == [str(rank) for rank in range(8)]
    assert len(set(ranks.values())) == 2  # one container a node
    assert len(cli_imports(result.stderr)) == 2, result.stderr[-2000:]
    assert hpc.leftovers() == {}


def test_a_task_without_an_image_gets_the_clis_message(squashed_tiny, stack):
    hpc = squashed_tiny
    script = (
        f'if [ "$SLURM_LOCALID" = 0 ]; then exec podman-hpc shared-run {stack.tiny_image} sleep 3; '
        "else sleep 1; exec podman-hpc shared-run -e X=1; fi"
    )
    failed = run(["srun", "-N1", "-n2", "sh", "-c", script], env=hpc.env, check=False, timeout=120)
    assert failed.returncode == 125
    assert "Error: usage: podman-hpc shared-run [options] IMAGE" in failed.stderr
    assert "Traceback" not in failed.stderr
    assert hpc.leftovers() == {}
