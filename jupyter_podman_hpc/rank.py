"""The ``podman-hpc`` console script's first stop: a shared-run task that is not its node's first.

Every task of a podman-exec step starts ``podman-hpc shared-run ...``. The
node's first task goes through the whole CLI (configuration, modules, podman)
and starts the step monitor. Every other task only needs the monitor: it sends
its arguments and environment over the step's socket (``stepsocket``), the
monitor (which has everything loaded) answers with a plan (join the
container's first process, whose pidfd comes with it, or the ``podman exec``
command line), and the task carries it out (``stepsocket.run_plan``, the path
the first task takes too). So this module imports only the leaf ``stepsocket``
(and ``engine.run.join`` for a plan that joins): that keeps such a task at a few ms of CPU.

A plan must have the expected shape before anything runs (``checked_plan``):
``podman`` (the configured ``podman_bin``, as this task finds it) exec in this
step's container, with only podman's own variables changed; a join only into
a process that is in a container (``engine.run.join``).
"""

import os
import sys

from .stepsocket import (
    Refused,
    address_of,
    container_name,
    environ_step_key,
    keep_listener,
    receive,
    rendezvous,
    reused_by_step,
    run_plan,
    send,
)

CONFIG_FILE = "/etc/podman_hpc/podman_hpc.yaml"  # engine.site.config's DEFAULT_CONFIG_FILE
# what the monitor may change in the environment podman exec runs with (SiteConfig.podman_env)
PODMAN_ENV_SET = frozenset(
    (
        "XDG_CONFIG_HOME",
        "PODMANHPC_SQUASH_READ_PATH",
        "PODMANHPC_SQUASH_UNPACK_DIR",
        "PODMANHPC_SQUASH_UNPACK_MAX_MB",
        "PODMANHPC_SQUASH_UNPACK_IDLE_MINUTES",
        "PODMANHPC_SQUASH_JOB",
        "PODMANHPC_SQUASH_JOB_NODES",
        "PODMANHPC_SQUASH_UNPACK_AUTO_JOB_MAX_MB",
    )
)
PODMAN_ENV_UNSET = frozenset(("XDG_RUNTIME_DIR",))
PLAN_KEYS = frozenset(("join", "command", "env", "workdir", "argv", "podman_env"))
REFUSED = 125  # podman's code for errors of the tool itself


# --- the plan --------------------------------------------------------------------


def checked_plan(plan, key: str, environ) -> dict:
    """The monitor's plan if it has the shape the monitor gives (see ``engine.run.taskplan.task_plan``),
    else Refused: the command runs in this step's container (or the one its job's steps share on the
    node), podman is podman, and podman's environment is this task's with only podman's own variables
    changed."""
    _check_shape(plan)
    _check_exec(plan["argv"], plan["command"], key, environ)
    _check_podman_env(plan["podman_env"])
    return plan


def _strings(value) -> bool:
    return type(value) is list and all(type(word) is str for word in value)


def _mapping(value) -> bool:
    return type(value) is dict and all(type(k) is str and type(v) is str for k, v in value.items())


def _check_shape(plan) -> None:
    """Refused unless the plan has the monitor's keys, a join flag, a command, and an env and a workdir
    that are None or what they should be."""
    if type(plan) is not dict or set(plan) != PLAN_KEYS:
        raise Refused("the step monitor's plan is malformed: nothing was run")
    if not (
        type(plan["join"]) is bool
        and _strings(plan["command"])
        and plan["command"]
        and (plan["env"] is None or _mapping(plan["env"]))
        and (plan["workdir"] is None or type(plan["workdir"]) is str)
    ):
        raise Refused("the step monitor's plan is malformed: nothing was run")


def _check_exec(argv, command: list[str], key: str, environ) -> None:
    """Refused unless ``argv`` is ``PODMAN ... exec ... CONTAINER COMMAND...`` with this step's container,
    or the one the job's steps share on the node (shared-run --reuse)."""
    tail = [container_name(os.getuid(), key), *command]
    if _strings(argv) and len(argv) > len(tail) and reused_by_step(argv[-len(tail)], os.getuid(), environ):
        tail[0] = argv[-len(tail)]
    if not (
        _strings(argv) and len(argv) > len(tail) + 1 and argv[-len(tail) :] == tail and "exec" in argv[1 : -len(tail)]
    ):
        raise Refused(
            f"the step monitor's plan does not podman exec in this step's container: "
            f"refusing {' '.join(argv[:1]) if _strings(argv) else 'it'}, nothing was run"
        )


def _check_podman_env(podman_env) -> None:
    """Refused unless the plan sets and unsets only what podman-hpc changes in podman's environment."""
    if not (
        type(podman_env) is dict
        and set(podman_env) == {"set", "unset"}
        and _mapping(podman_env["set"])
        and set(podman_env["set"]) <= PODMAN_ENV_SET
        and _strings(podman_env["unset"])
        and set(podman_env["unset"]) <= PODMAN_ENV_UNSET
    ):
        raise Refused(
            "the step monitor's plan changes more of podman's environment than podman-hpc does: nothing was run"
        )


def configured_podman(environ) -> str:
    """``podman_bin`` as this task can tell without loading the configuration (the variable,
    else a top-level ``podman_bin:`` line of the site's file, else ``podman``), found on PATH."""
    name = environ.get("PODMANHPC_PODMAN_BIN") or _file_setting(environ, "podman_bin") or "podman"
    if "/" in name:
        return os.path.abspath(name)
    for directory in (environ.get("PATH") or os.defpath).split(":"):
        candidate = os.path.join(directory or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    raise Refused(f"podman not found: {name} (set podman_bin in the site configuration)")


def _file_setting(environ, key: str) -> str | None:
    try:
        with open(environ.get("PODMANHPC_CONFIG_FILE") or CONFIG_FILE) as text:
            lines = text.read().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(f"{key}:"):
            value = line[len(key) + 1 :].split(" #")[0].strip()
            return value[1:-1] if value[:1] in "\"'" and value[-1:] == value[:1] and len(value) > 1 else value
    return None


def check_podman(path: str, environ) -> None:
    """Refused unless ``path`` is the configured podman (the same file)."""
    expected = configured_podman(environ)
    try:
        same = os.path.samestat(os.stat(path), os.stat(expected))
    except OSError:
        same = False
    if not same:
        raise Refused(
            f"the step monitor's plan runs {path}, not the configured podman ({expected}): refusing it, nothing was run"
        )


def _error_reply(reply) -> tuple[str, int]:
    """The monitor's refusal as one line and an exit code (whatever the peer sent)."""
    message = reply.get("error")
    message = message.splitlines()[0] if type(message) is str and message else "the step monitor refused"
    code = reply.get("code", REFUSED)
    return message, code if type(code) is int and 0 < code < 256 else REFUSED


def shared_run_task(argv: list[str]) -> int | None:
    """Run this task through the step monitor; None if the whole CLI must (first task, no step)."""
    key = environ_step_key(os.environ)
    if key is None:
        return None
    kind, sock = rendezvous(address_of(key))
    if kind == "listener":
        keep_listener(sock)
        return None
    send(sock, {"kind": "plan", "argv": argv, "env": dict(os.environ), "cwd": os.getcwd()})
    pidfds: list[int] = []
    reply = receive(sock, pidfds)
    if reply is None:
        print("Error: shared-run: the step monitor exited", file=sys.stderr)
        return REFUSED
    if type(reply) is not dict:
        raise Refused("the step monitor's answer is malformed: nothing was run")
    if "error" in reply:
        message, code = _error_reply(reply)
        print(f"Error: {message}", file=sys.stderr)
        return code
    plan = checked_plan(reply.get("plan"), key, os.environ)
    if plan["join"] and len(pidfds) != 1:
        raise Refused("the step monitor's plan joins a container but sent no process of it: nothing was run")
    check_podman(plan["argv"][0], os.environ)
    # sock stays open: the monitor counts this task until it ends
    return run_plan(plan, pidfds[0] if pidfds else None, join=_join)


def _join(pidfd: int, command, env, workdir) -> int | None:
    from .engine.run.join import run_joined  # ctypes, resource: loaded only by a task that joins

    return run_joined(pidfd, command, env, workdir)


def main() -> int:
    """The ``podman-hpc`` console script: a shared-run task that is not its node's first runs through the
    step monitor (an OSError on the step's socket: one ``Error:`` line, exit code ``REFUSED``); everything
    else goes to the CLI."""
    argv = sys.argv[1:]
    if argv[:1] == ["shared-run"] and argv[1:2] not in (["--help"], ["-h"]):
        try:
            code = shared_run_task(argv)
        except OSError as err:
            print(f"Error: shared-run: {err}", file=sys.stderr)
            return REFUSED
        if code is not None:
            return code
    from .cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
