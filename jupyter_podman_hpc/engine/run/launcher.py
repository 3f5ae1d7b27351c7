"""podman-exec ("shared-run"): every task of a Slurm step runs in its node's one container.

``podman-hpc shared-run [options] IMAGE ARGS...`` runs as every task of a
job step. On each node, the task that binds the step's rendezvous
(``jupyter_podman_hpc.stepsocket``: a keyed abstract socket, and how both ends
check that the other is the user's own process on the host) starts the
*step monitor* (``stepmonitor``), which starts the container and answers the
tasks. Each task runs what ``podman run IMAGE ARGS`` would run
(``taskplan``), with its own Slurm/PMI environment, through the one path
every task takes (``stepsocket.run_plan``), and keeps its connection open until it
exits. Names derive from the user, job, step and node (``stepcontext``), so
steps, jobs, users and nodes sharing a host never collide. Per-process mode,
one container a task, is ``perprocess``.
"""

from __future__ import annotations

import json
import math
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

from ... import stepsocket
from ..base import commands, processes
from ..errors import EngineError, PermissionDenied
from ..podman import Podman
from ..store.access import configured_stores
from ..store.graphroot import stored_command
from . import jobcontainer
from .join import run_joined
from .stepcontext import StepContext, step_context
from .stepmonitor import IMAGE_COMMAND, MONITOR_LOG, ContainerStart, start_monitor
from .taskplan import RunningContainer, split_options, task_command, task_plan


def shared_run(
    podman: Podman,
    options: Sequence[str],
    module_args: Sequence[str],
    image: str,
    command: Sequence[str],
    environ: Mapping[str, str],
    join: bool,
    reuse: bool = False,
) -> int:
    """Run ``command`` as this task inside the node's shared container; returns its exit code.

    ``join`` enters the container by joining its namespaces (falling back to
    ``podman exec`` where only podman can do what the options ask). ``reuse``
    (in a Slurm job) runs it in the container the job's steps with this image and
    options share on the node (``jobcontainer``), started by the first of them.
    """
    config = podman.config
    context = step_context(config, environ)
    runs = Path(config.run_root) / "shared-run"
    directory = runs / context.key  # the monitor's: made and removed by it
    run_options, exec_options, entrypoint = split_options(podman, options)
    # The node container only keeps the namespaces alive: the image's
    # ENTRYPOINT is for the tasks, which run what `podman run IMAGE ARGS` would.
    keep_alive = ["--entrypoint", json.dumps(config.shared_run_command)]
    # --rm: once its first process is killed, conmon's clean-up removes the container (stepmonitor)
    head, tail = [*run_options, "-d", "--rm", "--replace"], [*keep_alive, image]  # around its name and pid file
    job_container = None
    if reuse and stepsocket.step_ids(environ) is not None:
        key = jobcontainer.reuse_key(context.job_id, context.node, [*head, *tail, *module_args])
        job_container, name = runs / key, stepsocket.container_name(os.getuid(), key)
    else:
        name = context.container_name(os.getuid())
    pidfile = (job_container or directory) / jobcontainer.PIDFILE
    known = None if entrypoint is not None else stored_command([config.graph_root, *configured_stores(config)], image)
    start = ContainerStart(
        podman.run_command([*head, "--name", name, "--pidfile", str(pidfile), *tail], module_args),
        None
        if entrypoint is not None or known is not None
        else podman.command(("image", "inspect"), "--format", IMAGE_COMMAND, image),
        config.shared_run_command,
        pidfile,
        known,
        job_container,
        config.shared_run_reuse_linger,
    )
    connection, container, pidfd = _join_step(podman, directory, name, start, context)
    try:
        plan = task_plan(
            podman, name, task_command(entrypoint, container, command), exec_options, environ, join, os.getcwd()
        )
        # the path every other task of the node takes with the monitor's plan (rank.shared_run_task)
        return stepsocket.run_plan(plan, pidfd, environ, join=run_joined, log=commands.log)
    finally:
        connection.close()
        os.close(pidfd)


def _join_step(
    podman: Podman, directory: Path, name: str, start: ContainerStart, context: StepContext
) -> tuple[socket.socket, RunningContainer, int]:
    """Connect to the node's step monitor (starting it if we are first) and wait until ready;
    the connection, the container and a pidfd of its first process."""
    config = podman.config
    try:
        connection = _monitor_connection(podman, directory, name, start, context)
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
        raise EngineError(
            f"shared-run: cannot start container {name}: {(reply or {}).get('failed') or 'the step monitor exited'}"
        )
    return connection, RunningContainer(**reply["ready"]), pidfds[0]


def _monitor_connection(
    podman: Podman, directory: Path, name: str, start: ContainerStart, context: StepContext
) -> socket.socket:
    """A connection to the node's step monitor, which this task starts if it is the node's first."""
    address = stepsocket.address_of(context.key)
    listener = stepsocket.take_listener()  # the console script may have won the election already
    if listener is None:
        kind, sock = stepsocket.rendezvous(address)
        if kind != "listener":
            return sock
        listener = sock
    start_monitor(
        podman, directory, listener, name, start, context.tasks_on_node, processes.ancestor_pidfd("slurmstepd")
    )
    kind, connection = stepsocket.rendezvous(address)
    if kind == "listener":  # nobody holds the address: the monitor is gone already
        connection.close()
        raise EngineError(
            f"shared-run: the step monitor for {name} did not start (see {MONITOR_LOG} in {podman.config.run_root})"
        )
    return connection


def _scaled(value: float, tasks: int) -> float:
    """podman-hpc scales its wait by 1 + log2(tasks per node)."""
    return value * (1 + math.log2(max(tasks, 1)))
