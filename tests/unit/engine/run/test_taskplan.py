"""What a task of a podman-exec step runs: its command, its exec options and variables."""

from jupyter_podman_hpc.engine.errors import EngineError
from jupyter_podman_hpc.engine.run.taskplan import exec_env


def test_exec_env_follows_podman_exec_options():
    environ = {"SLURM_PROCID": "3", "SLURM_NODEID": "1", "HOME": "/h", "PMI_RANK": "3"}
    env = exec_env(["-e", "SLURM_*", "-e", "HOME", "--env=A=1", "-eB=2", "-w", "/x", "-e", "UNSET"], environ)
    assert env == {"SLURM_PROCID": "3", "SLURM_NODEID": "1", "HOME": "/h", "A": "1", "B": "2"}
    assert exec_env(["--user", "1000"], environ) is None  # podman exec must do that one


def test_task_command_is_what_podman_run_would_run():
    from jupyter_podman_hpc.engine.run.taskplan import RunningContainer, parse_entrypoint, task_command

    image = RunningContainer(1, ["/bin/sh", "-c"], ["echo default"])
    assert task_command(None, image, ["echo hi"]) == ["/bin/sh", "-c", "echo hi"]
    assert task_command(None, image, []) == ["/bin/sh", "-c", "echo default"]
    assert task_command(["/bin/echo"], image, []) == ["/bin/echo"]  # --entrypoint drops the CMD
    assert task_command(None, RunningContainer(1, None, ["sh"]), ["true"]) == ["true"]
    assert parse_entrypoint('["a", "b c"]') == ["a", "b c"]
    assert parse_entrypoint("/bin/echo") == ["/bin/echo"] and parse_entrypoint("") == []
    try:
        task_command(None, RunningContainer(1, None, None), [])
    except EngineError as err:
        assert "no command" in str(err)
    else:
        raise AssertionError("an image without a command must be refused")
