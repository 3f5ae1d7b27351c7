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


def _monitor_plan(tmp_path, env, argv):
    """What a step monitor answers a task (StepMonitor._plan), with a private configuration."""
    import os

    from jupyter_podman_hpc import stepsocket
    from jupyter_podman_hpc.engine.launcher import RunningContainer, StepMonitor
    env = {**os.environ, **env, "PODMANHPC_RUN_ROOT": str(tmp_path / "run"),
           "PODMANHPC_GRAPH_ROOT": str(tmp_path / "run" / "storage"),
           "PODMANHPC_CONFIG_HOME": str(tmp_path / "run" / "config"), "SQUASH_DIR": str(tmp_path / "squash"),
           "PODMANHPC_SQUASH_UNPACK_DIR": str(tmp_path / "unpacked")}
    (tmp_path / "squash").mkdir(exist_ok=True)
    monitor = StepMonitor.__new__(StepMonitor)
    monitor.name = stepsocket.container_name(os.getuid(), stepsocket.environ_step_key(env))
    monitor.state = {"ready": {"pid": 1}}
    monitor.container = RunningContainer(1, None, ["sh"])
    monitor.engines = {}
    return monitor._plan({"kind": "plan", "argv": argv, "env": env, "cwd": "/"}), env


def test_the_monitors_plans_pass_the_tasks_checks(tmp_path):
    """What rank.checked_plan and rank.check_podman allow is exactly what the monitor sends."""
    from jupyter_podman_hpc import rank, stepsocket
    from jupyter_podman_hpc.engine import taskrun
    step = {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "2", "SLURMD_NODENAME": "n1", "PMI_FD": "7",
            "XDG_RUNTIME_DIR": "/run/user/x"}
    for argv in (["shared-run", "img", "echo", "hi"], ["shared-run", "--no-join", "-e", "A=1", "img"],
                 ["shared-run", "--user", "1000", "img", "id"]):
        reply, env = _monitor_plan(tmp_path, step, argv)
        plan = rank.checked_plan(reply["plan"], stepsocket.environ_step_key(env), env)
        rank.check_podman(plan["argv"][0], env)
        assert plan["join"] == (argv[1] == "img")
        assert plan["podman_env"]["unset"] == ["XDG_RUNTIME_DIR"]
        assert "--preserve-fds" in plan["argv"]  # PMI_FD: the task moves its own to 3
        changed = taskrun.podman_environ(plan["podman_env"], env)
        assert changed["XDG_CONFIG_HOME"] == str(tmp_path / "run" / "config")
