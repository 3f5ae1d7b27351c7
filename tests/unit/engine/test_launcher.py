"""Launcher helpers: Slurm's task counts, step context, names and exec environments."""

from jupyter_podman_hpc.engine.config import load_config
from jupyter_podman_hpc.engine.errors import EngineError
from jupyter_podman_hpc.engine.launcher import exec_env, step_context, step_env_args, tasks_per_node


def test_tasks_per_node_expands_slurm_counts():
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("8") == [8]


def test_step_context_picks_this_nodes_count_and_names_never_collide():
    config = load_config({})
    env = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "3", "SLURMD_NODENAME": "n2", "SLURM_LOCALID": "1",
           "SLURM_STEP_TASKS_PER_NODE": "3,2(x2)", "SLURM_NODEID": "1"}
    context = step_context(config, env)
    assert (context.local_id, context.tasks_on_node) == (1, 2)
    other_step = step_context(config, {**env, "SLURM_STEP_ID": "4"})
    other_node = step_context(config, {**env, "SLURMD_NODENAME": "n3"})
    names = {c.container_name(1001) for c in (context, other_step, other_node)}
    assert len(names) == 3 and context.container_name(1001) != context.container_name(1002)


def test_exec_env_follows_podman_exec_options():
    environ = {"SLURM_PROCID": "3", "SLURM_NODEID": "1", "HOME": "/h", "PMI_RANK": "3"}
    env = exec_env(["-e", "SLURM_*", "-e", "HOME", "--env=A=1", "-eB=2", "-w", "/x", "-e", "UNSET"], environ)
    assert env == {"SLURM_PROCID": "3", "SLURM_NODEID": "1", "HOME": "/h", "A": "1", "B": "2"}
    assert exec_env(["--user", "1000"], environ) is None  # podman exec must do that one


def test_per_process_containers_get_the_slurm_environment_only_in_a_step():
    config = load_config({})
    assert step_env_args(config, {}) == []
    assert "SLURM_*" in step_env_args(config, {"SLURM_STEP_ID": "0"})


def test_task_command_is_what_podman_run_would_run():
    from jupyter_podman_hpc.engine.launcher import RunningContainer, parse_entrypoint, task_command
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


def test_grouped_short_flags_are_split_as_podman_reads_them():
    from jupyter_podman_hpc.engine.launcher import _split_short_flags
    table = {"-i": False, "-t": False, "-e": True, "-w": True}
    assert _split_short_flags([["-it"], ["-eA=1"], ["-e", "B=2"], ["--tty"]], table) == [
        ["-i"], ["-t"], ["-e", "A=1"], ["-e", "B=2"], ["--tty"]]
