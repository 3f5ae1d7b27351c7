"""The step monitor's answers to the tasks that are not their node's first."""


def _monitor_plan(tmp_path, env, argv):
    """What a step monitor answers a task (StepMonitor._plan), with a private configuration."""
    import os

    from jupyter_podman_hpc import stepsocket
    from jupyter_podman_hpc.engine.run.stepmonitor import StepMonitor
    from jupyter_podman_hpc.engine.run.taskplan import RunningContainer

    env = {
        **os.environ,
        **env,
        "PODMANHPC_RUN_ROOT": str(tmp_path / "run"),
        "PODMANHPC_GRAPH_ROOT": str(tmp_path / "run" / "storage"),
        "PODMANHPC_CONFIG_HOME": str(tmp_path / "run" / "config"),
        "SQUASH_DIR": str(tmp_path / "squash"),
        "PODMANHPC_SQUASH_UNPACK_DIR": str(tmp_path / "unpacked"),
    }
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

    step = {
        "SLURM_JOB_ID": "5",
        "SLURM_STEP_ID": "2",
        "SLURMD_NODENAME": "n1",
        "PMI_FD": "7",
        "XDG_RUNTIME_DIR": "/run/user/x",
    }
    for argv in (
        ["shared-run", "img", "echo", "hi"],
        ["shared-run", "--no-join", "-e", "A=1", "img"],
        ["shared-run", "--user", "1000", "img", "id"],
    ):
        reply, env = _monitor_plan(tmp_path, step, argv)
        plan = rank.checked_plan(reply["plan"], stepsocket.environ_step_key(env), env)
        rank.check_podman(plan["argv"][0], env)
        assert plan["join"] == (argv[1] == "img")
        assert plan["podman_env"]["unset"] == ["XDG_RUNTIME_DIR"]
        assert "--preserve-fds" in plan["argv"]  # PMI_FD: the task moves its own to 3
        changed = stepsocket.podman_environ(plan["podman_env"], env)
        assert changed["XDG_CONFIG_HOME"] == str(tmp_path / "run" / "config")


def test_a_monitor_sweeps_only_the_steps_of_its_node_whose_monitor_is_gone(tmp_path, removals):
    """Swept: a step directory whose lock file nobody holds. Kept: one whose monitor holds it, one
    locked a moment ago (a monitor's first instant), one without a lock file (an older podman-hpc's
    monitor may run), another node's, and a job's shared container (its lingerer's)."""
    import fcntl
    import os
    import time

    from jupyter_podman_hpc import stepsocket
    from jupyter_podman_hpc.engine.base.locks import NEW_LOCK_GRACE
    from jupyter_podman_hpc.engine.run.stepmonitor import MONITOR_LOCK, StepMonitor

    runs = tmp_path / "shared-run"
    old = time.time() - NEW_LOCK_GRACE - 10
    for key, lock in {
        "9.0.n1": "old",
        "9.1.n1": "old",
        "9.2.n1": "new",
        "9.3.n1": None,
        "9.4.n2": "old",
        f"9.reuse-{'a' * stepsocket.DIGEST_SIZE}.n1": "old",
        "9.5.n1": "old",
    }.items():
        (runs / key).mkdir(parents=True)
        if lock:
            (runs / key / MONITOR_LOCK).touch()
            if lock == "old":
                os.utime(runs / key / MONITOR_LOCK, (old, old))
    held = os.open(runs / "9.1.n1" / MONITOR_LOCK, os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)  # 9.1's monitor lives

    monitor = StepMonitor.__new__(StepMonitor)
    monitor.podman, monitor.directory, monitor.name = removals, runs / "9.5.n1", "podman-hpc-x-9.5.n1"
    monitor._sweep_killed_monitors()
    os.close(held)
    gone = stepsocket.container_name(os.getuid(), "9.0.n1")
    assert removals.removed == [gone] and removals.killed == [gone]
    assert sorted(path.name for path in runs.iterdir()) == [
        "9.1.n1",
        "9.2.n1",
        "9.3.n1",
        "9.4.n2",
        "9.5.n1",
        f"9.reuse-{'a' * stepsocket.DIGEST_SIZE}.n1",
    ]
