"""Launching containers under Slurm: podman-exec ("shared-run") and per-process.

``podman-hpc shared-run [options] IMAGE ARGS...`` runs as every task of a
job step. On each node, the task that binds the step's rendezvous (an
abstract unix socket named by a hash of the step key, job, step and node,
keyed with a secret of the user's; ``jupyter_podman_hpc.stepsocket`` says why, and
how both ends check that the other is the user's own process on the host)
starts a *step monitor*: a small detached
process that starts one container (``shared_run_command`` as its
entrypoint, so the image's ENTRYPOINT cannot stop it) and serves the
socket. Every task connects and waits for the monitor's answer (no polling
of podman): the first task gets the container's first process and the
image's ENTRYPOINT/CMD, every other task sends only its arguments and
environment and gets its whole plan (join the container, or the ``podman
exec`` line; a join comes with a pidfd of the container's first process),
so it never loads the CLI. Each task runs what ``podman run
IMAGE ARGS`` would run, with its own Slurm/PMI environment, and keeps its
connection open until it exits. A connection closes when its task ends,
however it ends (normal exit, failure, scancel's signals, a crash): when all
the node's tasks have closed theirs, the monitor removes the container,
confirms it is gone (retrying if not) and logs failures in the run root.
Names derive from the user, job, step and node, so steps, jobs, users and
nodes sharing a host never collide.
"""

from __future__ import annotations

import json
import math
import os
import re
import select
import selectors
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from . import commands
from .errors import EngineError, PermissionDenied
from .podman import Podman, error_message, flag_name, group_options
from .store import configured_stores, stored_command
from .taskrun import run_plan
from .. import stepsocket


@dataclass(frozen=True)
class StepContext:
    """Where this task sits: its job step, node and rank on the node."""

    job_id: str
    step_id: str
    node: str
    local_id: int
    tasks_on_node: int

    @property
    def key(self) -> str:
        return stepsocket.step_key(self.job_id, self.step_id, self.node)

    def container_name(self, uid: int) -> str:
        return stepsocket.container_name(uid, self.key)


def tasks_per_node(value: str) -> list[int]:
    """Slurm's compressed count list: "2(x3),1" -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in value.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise ValueError(value)
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def step_context(config, environ: Mapping[str, str]) -> StepContext:
    """The task's place in its step, from the Slurm environment (a lone task outside Slurm;
    a job's batch script, outside a step, is step 0). In a step, its key is the step socket's
    (``stepsocket.environ_step_key``)."""
    node = stepsocket.node_name(environ)
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job:
        return StepContext(f"pid{os.getpid()}", "0", node, 0, 1)
    job, step, node = stepsocket.step_ids(environ) or (job, "0", node)
    local_id = int(environ.get(config.localid_var) or 0)
    raw = environ.get(config.tasks_per_node_var, "1")
    try:
        counts = tasks_per_node(raw)
        node_index = int(environ.get("SLURM_NODEID") or 0)
        count = counts[node_index] if node_index < len(counts) else counts[0]
    except (ValueError, IndexError):
        found = re.search(config.ntasks_pattern, raw)
        count = int(found.group(0)) if found else 1
    return StepContext(job, step, node, local_id, max(count, 1))


@dataclass
class Passthrough:
    """How this task's PMI file descriptor reaches the container (podman-hpc's PMI_FD)."""

    run_args: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None
    fds: tuple[int, ...] = ()


def pmi_fd_passthrough(environ: Mapping[str, str]) -> Passthrough:
    """Duplicate PMI_FD to fd 3 and have podman pass one extra descriptor."""
    moved = stepsocket.move_pmi_fd(environ)
    if not moved:
        return Passthrough()
    return Passthrough(stepsocket.pmi_fd_args(environ), {**environ, **moved}, (stepsocket.PMI_FD,))


def per_process_run(podman: Podman, options: Sequence[str], module_args: Sequence[str], image: str,
                    command: Sequence[str], environ: Mapping[str, str]) -> int:
    """One task's own container in a Slurm step (per-process mode); its exit code.

    podman runs as a child, not in our place: a detached reaper holding a pipe
    from this process removes the container when the task ends without
    podman having done it, e.g. when scancel's SIGKILL (after SIGTERM, which
    a container's PID 1 may ignore) takes podman down and leaves conmon and
    the container running. podman ending is not proof enough (on scancel it
    sometimes exits 0 with the container still up): the task tells the reaper
    it is done only if the container's process (its pid file) is gone too.
    """
    context = step_context(podman.config, environ)
    name = f"{context.container_name(os.getuid())}.{context.local_id}"
    ours = not any(flag_name([o]) in ("--name", "--pidfile") for o in options)
    named: list[str] = []
    reaper = None
    if ours:
        pidfile = Path(podman.config.run_root) / "per-process" / f"{name}.pid"
        pidfile.parent.mkdir(parents=True, exist_ok=True)
        named = ["--name", name, "--pidfile", str(pidfile)]
        reaper = _start_reaper(podman, name, pidfile)
    passthrough = pmi_fd_passthrough(environ)
    argv = podman.run_command([*passthrough.run_args, *step_env_args(podman.config, environ), *named,
                               *options, image, *command], module_args)
    env = podman.config.podman_env(passthrough.env) if passthrough.env else podman.env
    process = commands.popen(argv, env=env, pass_fds=passthrough.fds)
    stepsocket.forward_signals(process.pid)
    code = stepsocket.shell_code(process.wait())
    if reaper is not None:
        # "d": podman ended on its own and took the container along; anything else: remove it
        os.write(reaper, b"r" if _running(pidfile) else b"d")
        pidfile.unlink(missing_ok=True)
    return code


def _start_reaper(podman: Podman, name: str, pidfile: Path) -> int:
    """Fork a process that removes container ``name`` unless this process says "done" (``d``).

    Returns the pipe to say it on. The pipe is close-on-exec, so podman and
    its conmon never hold it: its other end sees EOF when this process dies.
    """
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.close(write_end)
            if os.read(read_end, 1) != b"d":
                podman.remove_containers(name)
            pidfile.unlink(missing_ok=True)
        finally:
            os._exit(0)
    os.close(read_end)
    os.waitpid(child, 0)
    return write_end


def _running(pidfile: Path) -> bool:
    """Whether the process whose pid ``pidfile`` holds is alive."""
    try:
        os.kill(int(pidfile.read_text().strip()), 0)
    except PermissionError:
        return True  # alive, as a subordinate uid of the user's namespace
    except (OSError, ValueError):
        return False  # no pid file (removed with the container), no such process, or not a pid
    return True


def in_slurm_step(environ: Mapping[str, str]) -> bool:
    return bool(environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID"))


def step_env_args(config, environ: Mapping[str, str]) -> list[str]:
    """In a Slurm step, a per-process container gets the task's Slurm/PMI environment
    (the same ``shared_run_exec_args`` patterns podman-exec mode passes to each exec)."""
    return list(config.shared_run_exec_args) if in_slurm_step(environ) else []


# --- the task side -----------------------------------------------------------


def shared_run(podman: Podman, options: Sequence[str], module_args: Sequence[str], image: str,
               command: Sequence[str], environ: Mapping[str, str], join: bool) -> int:
    """Run ``command`` as this task inside the node's shared container; returns its exit code.

    ``join`` enters the container by joining its namespaces (falling back to
    ``podman exec`` where only podman can do what the options ask).
    """
    config = podman.config
    context = step_context(config, environ)
    directory = Path(config.run_root) / "shared-run" / context.key
    directory.mkdir(parents=True, exist_ok=True)
    name = context.container_name(os.getuid())
    run_options, exec_options, entrypoint = _split_options(podman, options)
    # The node container only keeps the namespaces alive: the image's
    # ENTRYPOINT is for the tasks, which run what `podman run IMAGE ARGS` would.
    keep_alive = ["--entrypoint", json.dumps(config.shared_run_command)]
    known = None if entrypoint is not None else \
        stored_command([config.graph_root, *configured_stores(config)], image)
    start = ContainerStart(
        podman.run_command([*run_options, "-d", "--replace", "--name", name, "--pidfile",
                            str(directory / "container.pid"), *keep_alive, image], module_args),
        None if entrypoint is not None or known is not None else
        podman.command(("image", "inspect"), "--format", IMAGE_COMMAND, image),
        config.shared_run_command, known)
    connection, container, pidfd = _join_step(podman, directory, name, start, context)
    try:
        plan = task_plan(podman, name, task_command(entrypoint, container, command), exec_options, environ,
                         join, os.getcwd())
        # the path every other task of the node takes with the monitor's plan (rank.shared_run_task)
        return run_plan(plan, pidfd, environ, log=commands.log)
    finally:
        connection.close()
        os.close(pidfd)


def task_plan(podman: Podman, name: str, command: list[str], exec_options: Sequence[str],
              environ: Mapping[str, str], join: bool, cwd: str | None) -> dict:
    """What one task of a step runs in container ``name`` (``taskrun.run_plan``), the same for
    the node's first task and, sent by the step monitor, for every other: join the container
    with the variables the exec options set (None where only podman can do what they ask), or
    run the ``podman exec`` line with podman's environment (its changes to ``environ``: the
    task applies them itself, and moves its own PMI_FD to 3)."""
    exec_args = [*podman.config.shared_run_exec_args, *exec_options]
    overrides = exec_env(exec_args, environ) if join else None
    argv = podman.exec_command(name, command, [*stepsocket.pmi_fd_args(environ), *exec_args])
    # a task runs argv[0] only if it is the podman it finds itself: the one found on its PATH
    found = shutil.which(argv[0], path=environ.get("PATH"))
    if found is not None:
        argv[0] = os.path.join(cwd or "/", found)
    podman_env = podman.config.podman_env(environ)
    changes = {"set": {k: v for k, v in podman_env.items() if environ.get(k) != v},
               "unset": [k for k in environ if k not in podman_env]}
    return {"join": overrides is not None, "command": command, "env": overrides,
            "workdir": _workdir(exec_args), "argv": argv, "podman_env": changes}


def exec_env(exec_options: Sequence[str], environ: Mapping[str, str]) -> dict[str, str] | None:
    """The variables ``podman exec`` options would set: ``-e NAME=VALUE``, ``-e NAME``
    (from the task's environment) and ``-e 'PREFIX*'``. None if an option needs podman itself."""
    env: dict[str, str] = {}
    words = list(exec_options)
    while words:
        word = words.pop(0)
        name, has_value, value = word.partition("=")
        if name in ("-e", "--env"):
            spec = value if has_value else (words.pop(0) if words else "")
        elif word.startswith("-e") and len(word) > 2:
            spec = word[2:]
        elif name in ("-w", "--workdir"):
            if not has_value and words:
                words.pop(0)
            continue
        else:
            return None  # --user, --tty, --env-file, --privileged...: let podman do it
        key, has_assignment, assigned = spec.partition("=")
        if has_assignment:
            env[key] = assigned
        elif key.endswith("*"):
            env.update({k: v for k, v in environ.items() if k.startswith(key[:-1])})
        elif key in environ:
            env[key] = environ[key]
    return env


def _workdir(exec_options: Sequence[str]) -> str | None:
    words = list(exec_options)
    for i, word in enumerate(words):
        name, has_value, value = word.partition("=")
        if name in ("-w", "--workdir"):
            return value if has_value else (words[i + 1] if i + 1 < len(words) else None)
        if word.startswith("-w") and len(word) > 2 and not word.startswith("--"):
            return word[2:]
    return None


def _split_options(podman: Podman, options: Sequence[str]) -> tuple[list[str], list[str], list[str] | None]:
    """The user's options for starting the container, those that also apply to each exec,
    and the user's ``--entrypoint`` (None without one), which is each task's."""
    run_table = podman.options("run")
    exec_table = podman.options("exec")
    run_options: list[str] = []
    exec_options: list[str] = []
    entrypoint = None
    for group in _split_short_flags(group_options(options, run_table), run_table):
        name = flag_name(group)
        if name in ("--rm", "-d", "--detach", "--name"):
            continue  # the launcher decides these
        if name == "--entrypoint":
            entrypoint = parse_entrypoint(group[0].partition("=")[2] if "=" in group[0] else group[-1])
            continue
        if name in exec_table and name not in ("-d", "--detach", "--preserve-fds"):
            exec_options += group
        if name not in ("-i", "--interactive", "-t", "--tty"):
            run_options += group
    return run_options, exec_options, entrypoint


def _split_short_flags(groups: list[list[str]], table: Mapping[str, bool]) -> list[list[str]]:
    """Grouped short flags as podman reads them: ``-it`` -> ``-i``, ``-t``; ``-eA=1`` -> ``-e A=1``."""
    split: list[list[str]] = []
    for group in groups:
        word = group[0]
        if len(group) > 1 or word.startswith("--") or len(word) <= 2 or not word.startswith("-"):
            split.append(group)
            continue
        letters = word[1:]
        for i, letter in enumerate(letters):
            if table.get(f"-{letter}") and i + 1 < len(letters):
                split.append([f"-{letter}", letters[i + 1:]])
                break
            split.append([f"-{letter}"])
    return split


def parse_entrypoint(value: str) -> list[str]:
    """``--entrypoint`` as podman reads it: a JSON array, else one word; "" for none."""
    if value.startswith("["):
        try:
            words = json.loads(value)
            if isinstance(words, list) and all(isinstance(w, str) for w in words):
                return words
        except ValueError:
            pass
    return [value] if value else []


@dataclass(frozen=True)
class ContainerStart:
    """How a step monitor starts the node's container and learns what its tasks run."""

    run: list[str]                 # podman run -d ... IMAGE, with the keep-alive as entrypoint
    inspect: list[str] | None      # podman image inspect for the image's ENTRYPOINT and CMD
    keep_alive: list[str]
    image_command: tuple | None = None  # (ENTRYPOINT, CMD) read from the storages: no inspect


@dataclass(frozen=True)
class RunningContainer:
    """What the monitor tells each task: the container's first process, the image's command."""

    pid: int
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None


IMAGE_COMMAND = "{{json .Config.Entrypoint}}\t{{json .Config.Cmd}}"


def task_command(entrypoint: list[str] | None, container: RunningContainer, args: Sequence[str]) -> list[str]:
    """What ``podman run IMAGE ARGS`` runs: ENTRYPOINT + (ARGS or CMD); a ``--entrypoint``
    replaces the image's and drops its CMD."""
    if entrypoint is not None:
        command = [*entrypoint, *args]
    else:
        image_entrypoint = [] if container.entrypoint in (None, [""]) else container.entrypoint
        command = [*image_entrypoint, *(args or container.cmd or [])]
    if not command:
        raise EngineError("shared-run: no command given, and the image has no ENTRYPOINT or CMD")
    return command


def _join_step(podman: Podman, directory: Path, name: str, start: ContainerStart,
               context: StepContext) -> tuple[socket.socket, RunningContainer, int]:
    """Connect to the node's step monitor (starting it if we are first) and wait until ready;
    the connection, the container and a pidfd of its first process."""
    config = podman.config
    try:
        address = stepsocket.address_of(context.key)
        listener = stepsocket.take_listener()  # the console script may have won the election already
        if listener is None:
            kind, sock = stepsocket.rendezvous(address)
            listener, connection = (sock, None) if kind == "listener" else (None, sock)
        if listener is not None:
            _start_monitor(podman, directory, listener, name, start, context.tasks_on_node)
            kind, connection = stepsocket.rendezvous(address)
            if kind == "listener":  # nobody holds the address: the monitor is gone already
                connection.close()
                raise EngineError(f"shared-run: the step monitor for {name} did not start (see {MONITOR_LOG} "
                                  f"in {config.run_root})")
    except stepsocket.Refused as err:
        raise PermissionDenied(f"shared-run: {err}")
    stepsocket.send(connection, {"kind": "task"})
    timeout = _scaled(config.wait_timeout, context.tasks_on_node) + 60
    connection.settimeout(timeout)
    pidfds: list[int] = []
    try:
        reply = stepsocket.receive(connection, pidfds)
    except TimeoutError:
        connection.close()
        raise EngineError(f"shared-run: container {name} did not start within {timeout:.0f} s")
    connection.settimeout(None)
    if not reply or "ready" not in reply or len(pidfds) != 1:
        connection.close()
        for fd in pidfds:
            os.close(fd)
        raise EngineError(f"shared-run: cannot start container {name}: "
                          f"{(reply or {}).get('failed') or 'the step monitor exited'}")
    return connection, RunningContainer(**reply["ready"]), pidfds[0]


def _scaled(value: float, tasks: int) -> float:
    """podman-hpc scales its wait by 1 + log2(tasks per node)."""
    return value * (1 + math.log2(max(tasks, 1)))


# --- the step monitor ----------------------------------------------------------

MONITOR_LOG = "shared-run-monitor.log"  # in the run root: it outlives the step directories
PER_TASK_PREFIXES = ("SLURM_", "PMI_", "PMIX_", "OMPI_", "PALS_")


def _start_monitor(podman: Podman, directory: Path, listener, name: str, start: ContainerStart,
                   tasks: int) -> None:
    """Fork the detached monitor, which takes over the step's listening socket."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if os.fork() != 0:  # the grandchild is reparented: it outlives the task
                os._exit(0)
            # Let go of everything the task holds: Slurm's output pipes (srun
            # waits for them), PMI_FD, the step lock.
            devnull = os.open(os.devnull, os.O_RDWR)
            log = os.open(Path(podman.config.run_root) / MONITOR_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(devnull, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            keep = listener.fileno()
            os.closerange(3, keep)
            os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
            code = StepMonitor(podman, directory, socket.socket(fileno=listener.detach()), name, start,
                               tasks).run()
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        os._exit(code)
    listener.close()
    os.waitpid(pid, 0)


class StepMonitor:
    """Owns the node's container for one step: starts it, counts tasks, removes it."""

    REMOVE_ATTEMPTS = 5

    def __init__(self, podman: Podman, directory: Path, listener: socket.socket, name: str,
                 start: ContainerStart, tasks: int):
        self.podman = podman
        self.directory = directory
        self.listener = listener
        self.name = name
        self.start = start
        self.tasks = tasks
        self.selector = selectors.DefaultSelector()
        self.finished = 0
        self.state: dict = {}  # what every task hears first: {"ready": RunningContainer} or {"failed": why}
        self.container: RunningContainer | None = None
        self.engines: dict[tuple, tuple[Podman, object]] = {}
        self.buffers: dict[socket.socket, bytes] = {}
        self.counted: set[socket.socket] = set()  # connections that spoke: tasks (a check's retry is not)
        self.keep_alive: int | None = None  # a pidfd of the container's first process (no pid reuse)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(128 + signal.SIGTERM)))
        # listen() again: a connecting task's SO_PEERCRED names the process that listened
        # last, which must be this one, alive until the step ends (not the first task)
        self.listener.listen(stepsocket.BACKLOG)
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ)
        try:
            self.state = self._start_container()
            if "failed" in self.state:
                self._log(self.state["failed"])
            self._serve()
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(signum, signal.SIG_IGN)  # the clean-up runs to its end
            self._remove_container()
            self.listener.close()
            shutil.rmtree(self.directory, ignore_errors=True)
        return 0 if "ready" in self.state else 1

    def _log(self, message: str) -> None:
        print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {self.name}: {message}", flush=True)

    def _start_container(self) -> dict:
        """Start the container; the line every task gets (ready + what it needs, or failed + why)."""
        # podman run --replace removes a stale container of a crashed step with the same name
        inspect = self.start.inspect and self.podman.popen(self.start.inspect, stdout=subprocess.PIPE,
                                                           stderr=subprocess.PIPE, text=True)
        result = self.podman.run(self.start.run, check=False)
        if result.returncode != 0:
            if inspect:
                inspect.kill()
                inspect.wait()
            return {"failed": error_message(result.stderr, self.start.run)}
        entrypoint, cmd = self.start.image_command or (None, None)
        if inspect:
            out, err = inspect.communicate()
            if inspect.returncode != 0:  # podman run may have pulled the image meanwhile
                again = self.podman.run(self.start.inspect, check=False)
                out, err = (again.stdout, again.stderr) if again.returncode == 0 else (None, again.stderr)
            if out is None:
                return {"failed": f"cannot read the image's ENTRYPOINT and CMD: {error_message(err)}"}
            entrypoint, cmd = (json.loads(part) for part in out.strip().split("\t"))
        pid = self._wait_for_keep_alive()
        if pid is None:
            return {"failed": f"the container's keep-alive command ({' '.join(self.start.keep_alive)}) "
                              f"did not start: does the image have it?"}
        self.container = RunningContainer(pid, entrypoint, cmd)
        return {"ready": dict(self.container.__dict__)}

    def _wait_for_keep_alive(self) -> int | None:
        """The container's first process once it runs the keep-alive command (None if it died).

        podman run -d returns when the runtime has been told to start: for a
        moment the first process is still the runtime's init, with the
        runtime's environment and credentials, which a joining task must not copy.
        """
        expected = ("\0".join(self.start.keep_alive) + "\0").encode()
        deadline = time.monotonic() + self.podman.config.wait_timeout
        try:
            pid = int((self.directory / "container.pid").read_text().strip())
            self.keep_alive = os.pidfd_open(pid)
        except (OSError, ValueError):
            return None
        while time.monotonic() < deadline and self._keep_alive_running():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                    if cmdline.read() == expected:
                        return pid
            except OSError:
                return None
            time.sleep(0.001)
        return None

    def _serve(self) -> None:
        """Until every task of the node has come and gone (or nobody is left and nobody comes)."""
        idle_limit = max(self.podman.config.wait_timeout * 6, 60.0)
        last_change = time.monotonic()
        while self.finished < self.tasks:
            timeout = None if self.buffers else max(0.0, idle_limit - (time.monotonic() - last_change))
            events = self.selector.select(timeout)
            if not events and not self.buffers:
                self._log(f"no task connected for {idle_limit:.0f} s: removing the container")
                return
            for key, _ in events:
                if key.fileobj is self.listener:
                    self._accept()
                elif not self._read(key.fileobj):  # the task ended
                    self.selector.unregister(key.fileobj)
                    del self.buffers[key.fileobj]
                    if key.fileobj in self.counted:
                        self.counted.discard(key.fileobj)
                        self.finished += 1
                    key.fileobj.close()
                    last_change = time.monotonic()
            if "ready" not in self.state and not self.buffers:
                return

    def _accept(self) -> None:
        try:
            connection, _ = self.listener.accept()
        except BlockingIOError:
            return
        problem = stepsocket.peer_problem(connection)
        if problem is not None:  # the rendezvous is an abstract socket: only this user's tasks count
            if problem != stepsocket.GONE:
                self._log(f"refused a connection from {problem}")
            connection.close()
            return
        self.selector.register(connection, selectors.EVENT_READ)
        self.buffers[connection] = b""

    def _read(self, connection: socket.socket) -> bool:
        """Answer the task's complete messages; False once it has closed its end."""
        try:
            data = connection.recv(65536)
        except OSError:
            data = b""
        if not data:
            return False
        messages, self.buffers[connection] = stepsocket.unframe(self.buffers[connection] + data)
        for message in messages:
            self.counted.add(connection)
            reply = self._plan(message) if message.get("kind") == "plan" else self.state
            # a task joins from the container's pidfd, never from a pid that may be reused
            joins = "ready" in reply or reply.get("plan", {}).get("join")
            try:
                stepsocket.send(connection, reply, [self.keep_alive] if joins else ())
            except OSError:
                pass
        return True

    def _plan(self, request: dict) -> dict:
        """What a task that sent only its arguments and environment runs (``task_plan``, see jupyter_podman_hpc.rank):
        the same parse and options as the whole CLI, with the task's own configuration."""
        if "ready" not in self.state:
            return {"error": f"shared-run: cannot start container {self.name}: {self.state['failed']}"}
        try:
            env = request["env"]
            podman, modules = self._engine(env)
            from .runplan import JOIN_FLAGS, parse_run_args, wants_join  # the CLI's (loaded already: we are its fork)
            options, image, args, _ = parse_run_args(podman, modules, request["argv"][1:])
            if image is None:
                raise EngineError("usage: podman-hpc shared-run [options] IMAGE [COMMAND...]", 125)
            join = wants_join(options, podman.config.shared_run_exec_mode)
            _, exec_options, entrypoint = _split_options(podman, [o for o in options if o not in JOIN_FLAGS])
            command = task_command(entrypoint, self.container, args)
        except EngineError as err:
            return {"error": str(err), "code": err.exit_code}
        # the task checks its shape (rank.checked_plan: PODMAN_ENV_SET/UNSET) before it runs it
        return {"plan": task_plan(podman, self.name, command, exec_options, env, join, request.get("cwd"))}

    def _engine(self, env: Mapping[str, str]):
        """podman and the modules for a task's configuration, loaded once per configuration
        (every variable but those Slurm and the MPI libraries set per task)."""
        key = tuple(sorted((k, v) for k, v in env.items() if not k.startswith(PER_TASK_PREFIXES)))
        if key not in self.engines:
            from .config import load_config
            from .modules import ModuleSet
            config = load_config(env)
            self.engines[key] = (Podman(config, env), ModuleSet.load(config.modules_dir, cache_dir=config.run_root))
        return self.engines[key]

    def _remove_container(self) -> None:
        """podman rm until the container is confirmed gone; what fails is logged."""
        for attempt in range(1, self.REMOVE_ATTEMPTS + 1):
            result = self.podman.remove_containers(self.name)
            if self._gone(result.returncode == 0):
                if attempt > 1:
                    self._log(f"removed at attempt {attempt}")
                return
            why = error_message(result.stderr or "") if result.returncode else "podman rm succeeded"
            self._log(f"still there after podman rm (attempt {attempt}): {why}")
            if self._keep_alive_running():
                signal.pidfd_send_signal(self.keep_alive, signal.SIGKILL)  # conmon then sees the container end
            time.sleep(0.5 * attempt)
        self._log(f"could not be removed after {self.REMOVE_ATTEMPTS} attempts")

    def _gone(self, removed: bool) -> bool:
        """Whether the container is gone: its first process is dead, and podman rm said so
        (or, when we never knew that process or rm failed, podman has no such container)."""
        if self._keep_alive_running():
            return False
        if removed and self.keep_alive is not None:
            return True
        exists = self.podman.run(self.podman.command(("container", "exists"), self.name), check=False)
        return exists.returncode == 1

    def _keep_alive_running(self) -> bool:
        """The container's first process has not exited (a pidfd polls readable once it has)."""
        if self.keep_alive is None:
            return False
        poller = select.poll()
        poller.register(self.keep_alive, select.POLLIN)
        return not poller.poll(0)
