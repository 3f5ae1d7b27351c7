"""The step monitor's answers to the tasks that are not their node's first."""


def _monitor_plan(tmp_path, env, argv):
    """What a step monitor answers a task (StepMonitor._plan), with a private configuration."""
    import os

    from jupyter_podman_hpc import stepsocket
    from jupyter_podman_hpc.engine.stepmonitor import StepMonitor
    from jupyter_podman_hpc.engine.taskplan import RunningContainer
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
        changed = stepsocket.podman_environ(plan["podman_env"], env)
        assert changed["XDG_CONFIG_HOME"] == str(tmp_path / "run" / "config")
