"""How every task of a podman-exec step carries out its plan: the one exec, wait and signal path.

A plan (``launcher.task_plan``, the same for the node's first task, which
builds it itself, and for every other task, which gets it from the step
monitor) says either to join the node container's namespaces or to run
``podman exec``. Both end the same way: the command runs as this task's child,
the task passes on the signals it gets and returns the child's exit code, 128 + N
for signal N, as a shell would.

On every non-first task's path: imports only the leaf ``stepsocket`` (and
``join`` when the plan joins), never the configuration or ``subprocess``.
"""

from __future__ import annotations

import os
import sys

from ..stepsocket import exec_and_wait

JOIN_FAILED = 125  # podman's code for errors of the tool itself


def podman_environ(changes, environ) -> dict:
    """``environ`` with the plan's changes to podman's variables (``SiteConfig.podman_env``)."""
    env = dict(environ)
    for name in changes["unset"]:
        env.pop(name, None)
    env.update(changes["set"])
    return env


def run_plan(plan, pidfd: int | None, environ=None, log=None) -> int:
    """Carry out a (checked) plan for this task; its exit code. ``pidfd`` is the container's
    first process (to join); ``log(argv, outcome)`` hears podman's start and end."""
    environ = os.environ if environ is None else environ
    if plan["join"]:
        from . import join  # ctypes, resource: cheap and built in
        try:
            return join.join_and_run(pidfd, plan["command"], plan["env"], plan["workdir"])
        except (join.CannotJoin, OSError):
            pass  # before anything irreversible: podman exec does it
        except join.JoinFailed as err:
            print(f"Error: shared-run: cannot enter the container: {err}", file=sys.stderr)
            return JOIN_FAILED
    return exec_and_wait(plan["argv"], podman_environ(plan["podman_env"], environ), environ, log)
