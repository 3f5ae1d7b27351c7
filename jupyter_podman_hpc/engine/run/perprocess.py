"""Per-process mode: each task of a Slurm step runs its own container (``podman-hpc run``
in a step), and nothing of it outlives the task."""

from __future__ import annotations

import fcntl
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ... import stepsocket
from ..base import commands, processes
from ..base.locks import abandoned_lock, held_flock
from ..podman import Podman, flag_name, group_options, split_short_flags
from .stepcontext import pmi_fd_passthrough, step_context, step_env_args


def per_process_run(
    podman: Podman,
    options: Sequence[str],
    module_args: Sequence[str],
    image: str,
    command: Sequence[str],
    environ: Mapping[str, str],
) -> int:
    """One task's own container in a Slurm step (per-process mode); its exit code.

    podman runs as a child, not in our place: a detached reaper holding a pipe
    from this process removes the container when the task ends without
    podman having done it, e.g. when scancel's SIGKILL (after SIGTERM, which
    a container's PID 1 may ignore) takes podman down and leaves conmon and
    the container running. podman ending is not proof enough (on scancel it
    sometimes exits 0 with the container still up): the task tells the reaper
    it is done only if podman was not killed and the container's process
    (its pid file) is gone too. After its removal the reaper also kills the
    container's conmon, if one is left: a podman killed between creating and
    starting the container leaves conmon and a ``runc init`` behind it. It
    looks again a few times over the next 10 s: a podman killed just after
    forking its conmon leaves a process that starts the container later.
    The task and its reaper hold a lock file while either lives; the node's
    next per-process task (at its start) or podman-exec step (at its end)
    removes what a task and reaper both killed left (SIGKILL, or a step's
    end under Slurm's proctrack/cgroup, which kills detached processes too).
    """
    context = step_context(podman.config, environ)
    name = f"{context.container_name(os.getuid())}.{context.local_id}"
    ours = not any(flag_name([o]) in ("--name", "--pidfile") for o in options)
    named, reaper = _own_container(podman, name) if ours else ([], None)
    passthrough = pmi_fd_passthrough(environ)
    log_driver = log_driver_args(options, podman.options("run"))
    argv = podman.run_command(
        [*passthrough.run_args, *step_env_args(podman.config, environ), *named, *log_driver, *options, image, *command],
        module_args,
    )
    env = podman.config.podman_env(passthrough.env) if passthrough.env else podman.env
    process = commands.popen(argv, env=env, pass_fds=passthrough.fds)
    passed = stepsocket.forward_signals(process.pid)
    code = stepsocket.shell_code(process.wait())
    if ours:
        code = task_code(code, passed, lambda: _exists(podman, name))
    if reaper is not None:
        _tell_reaper(reaper, code, passed)
    return code


@dataclass(frozen=True)
class _Reaper:
    """A task's reaper: the pipe the task tells it through, the container's pid file."""

    pipe: int
    pidfile: Path


def _own_container(podman: Podman, name: str) -> tuple[list[str], _Reaper]:
    """For a container the task names itself: the node's killed tasks swept first, its name and pid
    file options, and its reaper started under the task's lock."""
    sweep_killed_tasks(podman)
    pidfile = _pidfile(podman, name)
    named = ["--name", name, "--pidfile", str(pidfile)]
    # srun's or scancel's signal waits until the reaper exists: ended in between, this task would leave
    # a lock file that no reaper removes (the reaper keeps them blocked: its start is in the step's tree)
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _ENDING)
    try:
        # held, through the reaper's inherited copy too, until this process and its reaper have both ended
        held_flock(pidfile.parent, _lockfile(pidfile).name, fcntl.LOCK_EX)
        reaper = _start_reaper(podman, name, pidfile)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    return named, _Reaper(reaper, pidfile)


def _tell_reaper(reaper: _Reaper, code: int, passed: Sequence[int]) -> None:
    """The reaper's word at the task's end: "d", podman ended on its own and took the container along;
    "r", remove it."""
    # A podman killed or signalled while it started the container (a step cancelled at its start) leaves
    # conmon to start it and write the pid file after podman is gone: no pid file yet is no proof then.
    done = code < 128 and not ending(passed) and not _running(reaper.pidfile)
    try:
        os.write(reaper.pipe, b"d" if done else b"r")
    except BrokenPipeError:
        pass  # the reaper was killed: once this task ends too, the node's next task sweeps what is left
    if done:
        reaper.pidfile.unlink(missing_ok=True)  # else the reaper's, after the removal: never before it


def log_driver_args(options: Sequence[str], run_table: Mapping[str, bool]) -> list[str]:
    """``--log-driver passthrough``, unless the user chose a log driver, a terminal or a detached run.

    With podman's default driver conmon copies the container's output to the attached podman,
    and podman 4.3 sometimes loses all of it: under load (7 on 2 cores) about 1 task in 30 of
    ``srun -n8 podman-hpc run --rm`` printed nothing on either stream while its container ran
    and srun exited 0 (the fresh-clone run lost rank 1 in ``test_launcher.py`` so). passthrough
    hands the task's own stdin, stdout and stderr to the container: nothing is copied, so
    nothing can be lost.
    """
    for group in split_short_flags(group_options(options, run_table), run_table):
        if flag_name(group) in ("--log-driver", "-t", "--tty", "-d", "--detach"):
            return []  # podman refuses passthrough on a terminal
    return ["--log-driver", "passthrough"]


# seconds between the reaper's looks for a container started after its removal: a podman killed just
# after it forked its conmon leaves a process that becomes conmon, and starts the container, later
LATE_START_CHECKS = (1, 3, 6)

LOCK_SUFFIX = ".lock"  # <container name>.lock beside its pid file

# what ends a task (srun's and scancel's); SIGUSR1 and SIGUSR2 are the program's own business
_ENDING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def task_code(podman_code: int, passed: Sequence[int], container_left: Callable[[], bool]) -> int:
    """The task's exit code from podman's. A podman signalled while it started the container (a step
    cancelled at its start) can exit 0 with the container still there, or still to be started by
    conmon: that is no clean end, and srun must not report the cancelled step as a success. So a 0
    after an ending signal, with the container left (``container_left``, asked only then), is
    128 + that signal. A program that handles the signal and exits 0 is ended by podman, which removes
    its container (``--rm``), and keeps its 0."""
    if podman_code == 0 and ending(passed) and container_left():
        return 128 + ending(passed)[-1]
    return podman_code


def ending(passed: Sequence[int]) -> list[int]:
    """The signals among ``passed`` that end a task."""
    return [signum for signum in passed if signum in _ENDING]


def _exists(podman: Podman, name: str) -> bool:
    return podman("container", "exists", name, check=False).returncode == 0


def _tasks_dir(podman: Podman) -> Path:
    """Where the node's per-process tasks keep their containers' pid and lock files."""
    return Path(podman.config.run_root) / "per-process"


def _pidfile(podman: Podman, name: str) -> Path:
    """Container ``name``'s pid file (podman run --pidfile)."""
    return _tasks_dir(podman) / f"{name}.pid"


def _lockfile(pidfile: Path) -> Path:
    """The lock file beside a pid file, which the task and its reaper hold while either lives."""
    return pidfile.with_suffix(LOCK_SUFFIX)


def sweep_killed_tasks(podman: Podman) -> list[str]:
    """Remove the containers (and conmons, pid and lock files) of this node's per-process tasks whose task
    and reaper were both killed: nobody holds their lock file. The run root is the node's own (podman
    keeps its run state there), so every lock file in it is of this node. The containers' names."""
    removed = []
    tasks = _tasks_dir(podman)
    for lock in tasks.glob(f"*{LOCK_SUFFIX}"):
        held = abandoned_lock(tasks, lock.name)
        if held is None:
            continue
        try:
            name = lock.name[: -len(LOCK_SUFFIX)]
            _remove(podman, name, _pidfile(podman, name))
            removed.append(name)
        finally:
            os.close(held)
    return removed


def _start_reaper(podman: Podman, name: str, pidfile: Path) -> int:
    """Fork a process that removes container ``name`` unless this process says "done" (``d``).

    Returns the pipe to say it on. The pipe is close-on-exec, so podman and
    its conmon never hold it: its other end sees EOF when this process dies.
    """
    read_end, write_end = os.pipe()
    if processes.detach():
        try:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.close(write_end)
            if os.read(read_end, 1) != b"d":
                _remove(podman, name, pidfile)
                for pause in LATE_START_CHECKS:
                    time.sleep(pause)
                    if pidfile.exists() or processes.kill_conmon(name):
                        _remove(podman, name, pidfile)
            _drop_files(pidfile)
        finally:
            os._exit(0)
    os.close(read_end)
    return write_end


def _remove(podman: Podman, name: str, pidfile: Path) -> None:
    """The container, its stray conmon (and ``runc init``), then its pid and lock files: in that order.
    (A reaper killed during its later looks leaves no lock to sweep: only a late start would be missed.)"""
    podman.remove_containers(name)
    processes.kill_conmon(name)
    _drop_files(pidfile)


def _drop_files(pidfile: Path) -> None:
    """A task's pid file, then its lock file: once the lock is gone, no sweep looks for the container."""
    pidfile.unlink(missing_ok=True)
    _lockfile(pidfile).unlink(missing_ok=True)


def _running(pidfile: Path) -> bool:
    """Whether the process whose pid ``pidfile`` holds is alive."""
    try:
        os.kill(int(pidfile.read_text().strip()), 0)
    except PermissionError:
        return True  # alive, as a subordinate uid of the user's namespace
    except (OSError, ValueError):
        return False  # no pid file (removed with the container), no such process, or not a pid
    return True
