"""What one task of a podman-exec step runs in the node's container: ``podman run IMAGE ARGS``'s
command (the image's ENTRYPOINT and CMD, or the user's ``--entrypoint``), which of the user's
options start the container and which apply to each task, and the task's plan (join the
container with the variables the options set, or the ``podman exec`` line)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ... import stepsocket
from ..errors import EngineError
from ..podman import Podman, flag_name, group_options, split_short_flags


@dataclass(frozen=True)
class RunningContainer:
    """What the monitor tells each task: the container's first process, the image's command."""

    pid: int
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None


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


def task_plan(
    podman: Podman,
    name: str,
    command: list[str],
    exec_options: Sequence[str],
    environ: Mapping[str, str],
    join: bool,
    cwd: str | None,
) -> dict:
    """What one task of a step runs in container ``name`` (``stepsocket.run_plan``), the same for
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
    changes = {
        "set": {k: v for k, v in podman_env.items() if environ.get(k) != v},
        "unset": [k for k in environ if k not in podman_env],
    }
    return {
        "join": overrides is not None,
        "command": command,
        "env": overrides,
        "workdir": _workdir(exec_args),
        "argv": argv,
        "podman_env": changes,
    }


def exec_env(exec_options: Sequence[str], environ: Mapping[str, str]) -> dict[str, str] | None:
    """The variables ``podman exec`` options would set: ``-e NAME=VALUE``, ``-e NAME``
    (from the task's environment) and ``-e 'PREFIX*'``. None if an option needs podman itself."""
    env: dict[str, str] = {}
    words = list(exec_options)
    while words:
        word = words.pop(0)
        name, has_value, _ = word.partition("=")
        if name in ("-w", "--workdir"):
            if not has_value and words:
                words.pop(0)
            continue
        spec = _env_spec(word, words)
        if spec is None:
            return None  # --user, --tty, --env-file, --privileged...: let podman do it
        _apply_env_spec(spec, environ, env)
    return env


def _env_spec(word: str, words: list[str]) -> str | None:
    """What an ``-e`` option sets (taking its value from ``words`` when it is the next word);
    None for any other option."""
    name, has_value, value = word.partition("=")
    if name in ("-e", "--env"):
        return value if has_value else (words.pop(0) if words else "")
    if word.startswith("-e") and len(word) > 2:
        return word[2:]
    return None


def _apply_env_spec(spec: str, environ: Mapping[str, str], env: dict[str, str]) -> None:
    """Into ``env``, what one ``-e`` spec sets: NAME=VALUE, NAME from ``environ``, or PREFIX* from it."""
    key, has_assignment, assigned = spec.partition("=")
    if has_assignment:
        env[key] = assigned
    elif key.endswith("*"):
        env.update({k: v for k, v in environ.items() if k.startswith(key[:-1])})
    elif key in environ:
        env[key] = environ[key]


def _workdir(exec_options: Sequence[str]) -> str | None:
    words = list(exec_options)
    for i, word in enumerate(words):
        name, has_value, value = word.partition("=")
        if name in ("-w", "--workdir"):
            return value if has_value else (words[i + 1] if i + 1 < len(words) else None)
        if word.startswith("-w") and len(word) > 2 and not word.startswith("--"):
            return word[2:]
    return None


def split_options(podman: Podman, options: Sequence[str]) -> tuple[list[str], list[str], list[str] | None]:
    """The user's options for starting the container, those that also apply to each exec,
    and the user's ``--entrypoint`` (None without one), which is each task's."""
    run_table = podman.options("run")
    exec_table = podman.options("exec")
    run_options: list[str] = []
    exec_options: list[str] = []
    entrypoint = None
    for group in split_short_flags(group_options(options, run_table), run_table):
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
