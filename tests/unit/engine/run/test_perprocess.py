"""A per-process task's exit code when podman ends after srun's or scancel's signal, and its log driver."""

import signal

from jupyter_podman_hpc.engine.run.perprocess import log_driver_args, task_code


def asked(answer: bool, calls: list):
    def container_left() -> bool:
        calls.append(1)
        return answer

    return container_left


def test_a_zero_after_an_ending_signal_with_the_container_left_is_the_signal():
    calls: list = []
    assert task_code(0, [signal.SIGTERM], asked(True, calls)) == 128 + signal.SIGTERM
    assert task_code(0, [signal.SIGINT, signal.SIGTERM], asked(True, calls)) == 128 + signal.SIGTERM
    assert task_code(0, [signal.SIGUSR1, signal.SIGHUP], asked(True, calls)) == 128 + signal.SIGHUP


def test_a_program_that_handles_the_signal_keeps_its_code():
    calls: list = []
    assert task_code(0, [signal.SIGTERM], asked(False, calls)) == 0  # podman removed its container: a clean end
    assert task_code(3, [signal.SIGTERM], asked(True, calls)) == 3
    assert task_code(143, [signal.SIGTERM], asked(True, calls)) == 143
    assert len(calls) == 1  # podman is asked only about a 0 after an ending signal


def test_without_an_ending_signal_podman_is_not_asked():
    calls: list = []
    assert task_code(0, [], asked(True, calls)) == 0
    assert task_code(0, [signal.SIGUSR1, signal.SIGUSR2], asked(True, calls)) == 0
    assert calls == []


def test_the_output_passes_through_unless_a_log_driver_a_terminal_or_detach_is_asked():
    table = {
        "-d": False,
        "-e": True,
        "-i": False,
        "-t": False,
        "-v": True,
        "--detach": False,
        "--env": True,
        "--log-driver": True,
        "--rm": False,
        "--tty": False,
        "--volume": True,
    }
    passthrough = ["--log-driver", "passthrough"]
    assert log_driver_args([], table) == passthrough
    assert log_driver_args(["--env", "A=1", "-e", "B", "--rm", "-v", "/a:/a"], table) == passthrough
    assert log_driver_args(["-edata=1", "-e", "-t", "-v", "/d:/d"], table) == passthrough  # values, not flags
    for options in (
        ["--log-driver", "k8s-file"],
        ["--log-driver=none"],
        ["-t"],
        ["-it"],
        ["--tty"],
        ["--tty=true"],
        ["-d"],
        ["--detach"],
        ["--rm", "-dt"],
    ):
        assert log_driver_args(options, table) == [], options


def test_a_task_sweeps_only_the_containers_whose_task_and_reaper_are_gone(tmp_path, removals):
    """Swept: a lock file nobody holds (its task and reaper were killed), with its pid file. Kept: one a
    live task or reaper holds, one made a moment ago (a task's first instant), and other files."""
    import fcntl
    import os
    import time
    from types import SimpleNamespace

    from jupyter_podman_hpc.engine.base.locks import NEW_LOCK_GRACE
    from jupyter_podman_hpc.engine.run import perprocess

    removals.config = SimpleNamespace(run_root=str(tmp_path))
    tasks = tmp_path / "per-process"
    tasks.mkdir()
    old = time.time() - NEW_LOCK_GRACE - 10
    for name, age in {"killed": old, "alive": old, "starting": time.time()}.items():
        for suffix in (".lock", ".pid"):
            (tasks / f"podman-hpc-1-9.0.n1.{name}{suffix}").touch()
            os.utime(tasks / f"podman-hpc-1-9.0.n1.{name}{suffix}", (age, age))
    (tasks / "notes.txt").touch()
    held = os.open(tasks / "podman-hpc-1-9.0.n1.alive.lock", os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)

    swept = perprocess.sweep_killed_tasks(removals)
    os.close(held)
    assert swept == removals.removed == removals.killed == ["podman-hpc-1-9.0.n1.killed"]
    assert sorted(path.name for path in tasks.iterdir()) == [
        "notes.txt",
        "podman-hpc-1-9.0.n1.alive.lock",
        "podman-hpc-1-9.0.n1.alive.pid",
        "podman-hpc-1-9.0.n1.starting.lock",
        "podman-hpc-1-9.0.n1.starting.pid",
    ]
