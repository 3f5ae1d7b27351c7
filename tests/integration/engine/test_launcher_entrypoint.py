"""shared-run with images that have an ENTRYPOINT: the node container ignores it, every task
runs what `podman run IMAGE ARGS` would (ENTRYPOINT + ARGS, CMD, or the user's --entrypoint)."""

import pytest

from tests.helpers.commands import run
from tests.helpers.hpc import cleanup_hpc, make_hpc
from tests.helpers.launcher_steps import recording_podman

IMAGE = "localhost/tests/entrypoint:1"


@pytest.fixture(scope="module")
def entrypoint_image(stack):
    """A squashed image whose ENTRYPOINT is a shell taking one script, with a default CMD."""
    hpc = make_hpc(stack, "entrypoint")
    context = hpc.work / "context"
    context.mkdir()
    (context / "Containerfile").write_text(
        f'FROM {stack.tiny_image}\nENTRYPOINT ["/bin/sh", "-c"]\nCMD ["echo default $SLURM_PROCID"]\n'
    )
    hpc("build", "-t", IMAGE, context)
    hpc("migrate", IMAGE)
    hpc.wipe_local_storage()
    yield hpc
    cleanup_hpc(hpc)


def lines(result):
    return sorted(line for line in result.stdout.splitlines() if line.strip())


@pytest.mark.parametrize("mode", [["--no-join"], []], ids=["exec", "join"])
def test_each_task_runs_the_entrypoint_with_its_arguments(entrypoint_image, mode):
    hpc = entrypoint_image
    result = hpc.srun(
        "-N2", "--ntasks-per-node=2", "podman-hpc", "shared-run", *mode, IMAGE, 'echo "rank $SLURM_PROCID"'
    )
    assert lines(result) == [f"rank {rank}" for rank in range(4)]
    assert hpc.leftovers() == {}


@pytest.mark.parametrize(
    "name, inspected",
    [(IMAGE, False), ("tests/entrypoint:1", True)],
    ids=["read-from-the-store", "short-name-asks-podman"],
)
def test_without_arguments_each_task_runs_the_image_cmd(entrypoint_image, name, inspected):
    """A fully qualified name's ENTRYPOINT and CMD are read from the squashed store's records
    (no `podman image inspect` beside the container's start); a short name is podman's to resolve."""
    hpc = entrypoint_image
    podman, calls = recording_podman(hpc, f"cmd-{inspected}")
    result = run(
        ["srun", "-N1", "-n2", "podman-hpc", "shared-run", name], env={**hpc.env, "PODMANHPC_PODMAN_BIN": podman}
    )
    assert lines(result) == ["default 0", "default 1"]
    assert any(" image inspect " in f" {line} " for line in calls.read_text().splitlines()) is inspected


def test_the_users_entrypoint_replaces_the_images_and_drops_its_cmd(entrypoint_image):
    hpc = entrypoint_image
    word = hpc.srun("-N2", "-n2", "podman-hpc", "shared-run", "--entrypoint", "/bin/echo", IMAGE, "hi")
    assert lines(word) == ["hi", "hi"]
    alone = hpc.srun("-N1", "-n1", "podman-hpc", "shared-run", "--entrypoint=/bin/echo", IMAGE)
    assert lines(alone) == []  # echo with no arguments: the image's CMD is not appended
    assert alone.stdout == "\n"


@pytest.mark.parametrize("mode", [["--no-join"], []], ids=["exec", "join"])
def test_entrypoint_workdir_and_env_apply_to_every_task(entrypoint_image, mode):
    hpc = entrypoint_image
    result = hpc.srun(
        "-N2",
        "--ntasks-per-node=2",
        "podman-hpc",
        "shared-run",
        *mode,
        "--entrypoint",
        '["/bin/sh", "-c"]',
        "-w",
        "/etc",
        "-eX=1",
        "-e",
        "Y=2",
        IMAGE,
        'echo "$SLURM_PROCID $(pwd) $X $Y"',
    )
    assert lines(result) == [f"{rank} /etc 1 2" for rank in range(4)]
    assert hpc.leftovers() == {}


def test_interactive_terminal_per_task(entrypoint_image):
    """-it gives the task a terminal, as with run (srun --pty makes one for task 0)."""
    hpc = entrypoint_image
    result = run(
        [
            "script",
            "-qec",
            f"srun -N1 -n1 --pty podman-hpc shared-run -it {IMAGE} 'test -t 0 && test -t 1 && echo tty-yes'",
            "/dev/null",
        ],
        env=hpc.env,
        timeout=120,
    )
    assert "tty-yes" in result.stdout
    piped = run(
        ["srun", "-N1", "-n1", "podman-hpc", "shared-run", "-i", IMAGE, "read line; echo got $line"],
        env=hpc.env,
        input="hello\n",
        timeout=120,
    )
    assert lines(piped) == ["got hello"]
