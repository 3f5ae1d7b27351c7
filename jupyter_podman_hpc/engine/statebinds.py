"""The engine's own state kept out of every container, whatever the run options say.

The engine keeps per-user state on the node (``SiteConfig.state_dirs``: podman's
graph root, run root and configuration, the hooks, the unpacked copies of squashed
images with their checked-file records and squashfuse mounts). Container root is the
user's uid, so whatever of that state a container reaches, its image can rewrite:
another image's unpacked tree, podman's configuration, a hook the host runs. Two ways
in, both closed wherever podman starts a container (``Podman.command``: every front's
runs, and the CLI's create and build):

- ``--ipc=host`` (the usual advice for PyTorch's DataLoader and NCCL) hands the
  container the host's ``/dev/shm``, where the unpacked copies live. Such a container
  gets the user's own ``$PODMANHPC_PRIVATE_SHM`` at ``/dev/shm`` instead, as the MPI
  modules bind it: the IPC namespace stays the host's, and the user's containers on
  the node still share their segments (a mount of the user's own at ``/dev/shm`` is
  kept).
- A ``-v``/``--mount`` whose host source is, contains or lies inside a state
  directory (``-v /dev/shm:/dev/shm``, ``-v /tmp:/tmp``, ``-v /dev:/dev``) is refused
  in one line before anything starts.

The same guard keeps the host's processes out of reach: ``--pid=host`` together with
``SYS_PTRACE`` (``--privileged``, ``--cap-add=all`` or ``--cap-add=SYS_PTRACE`` without
dropping it) would let the image read the environment of the user's podman, mount program
and pause process on the node (the server's or the batch job's secrets) and trace them, so
it is refused in one line too. The MPI modules give every capability but that one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from .errors import InvalidInput
from .mount.squashfuse import MOUNTS_DIR
from .site.config import SiteConfig
from .site.modules import private_shm
from .site.readpath import node_state_dir
from .store.squashcheck import VERIFIED_DIR

HOST_SHM = "/dev/shm"
VOLUME_FLAGS = ("-v", "--volume")
# --mount types whose source is a host path (the others name a volume, an image or nothing)
HOST_PATH_TYPES = ("bind", "glob")
GLOB_CHARACTERS = "*?["
PTRACE = "SYS_PTRACE"


class Bind(NamedTuple):
    """One mount option of a run: as given (for messages), its host path ('' for none), its target."""

    option: str
    source: str
    target: str


def binds(options: Sequence[tuple[str, str]]) -> list[Bind]:
    """The mounts that ``(flag, value)`` options ask for (``-v``, ``--volume``, ``--mount``, ``--tmpfs``)."""
    found = []
    for flag, value in options:
        if flag in VOLUME_FLAGS:
            source, _, rest = value.partition(":")
            if rest:  # "DST" alone is an anonymous volume
                found.append(Bind(f"{flag} {value}", _host_path(source), rest.partition(":")[0]))
        elif flag == "--mount":
            found.append(_mount(value))
        elif flag == "--tmpfs":
            found.append(Bind(f"{flag} {value}", "", value.partition(":")[0]))
    return found


def _host_path(source: str) -> str:
    """A ``-v`` source as the host path podman binds ('' for a named volume)."""
    return os.path.abspath(source) if source.startswith(("/", ".")) else ""


def _mount(value: str) -> Bind:
    fields = dict(item.partition("=")[::2] for item in value.split(","))
    source = _first_set(fields, ("source", "src"))
    target = _first_set(fields, ("destination", "dst", "target"))
    kind = fields.get("type", "")
    if kind == "glob":
        source = _glob_base(source)
    host = kind in HOST_PATH_TYPES or (not kind and source.startswith("/"))
    return Bind(f"--mount {value}", _host_path(source) if host else "", target)


def _first_set(fields: Mapping[str, str], names: Sequence[str]) -> str:
    """The first non-empty value of a ``--mount`` field that has several names ('' for none)."""
    return next((fields[name] for name in names if fields.get(name)), "")


def _glob_base(pattern: str) -> str:
    """What a glob pattern may match lies below the directory before its first wildcard."""
    cut = min((i for i in map(pattern.find, GLOB_CHARACTERS) if i >= 0), default=len(pattern))
    return os.path.dirname(pattern[:cut]) if cut < len(pattern) else pattern


def reached_state(source: str, state_dirs: Sequence[str]) -> str:
    """The outermost state directory that a bind of ``source`` would reach ('' for none): the
    source is it, contains it or lies inside it (links resolved, as podman resolves them)."""
    where = Path(os.path.realpath(source))
    reached = [
        state
        for state in map(os.path.realpath, state_dirs)
        if where == Path(state) or Path(state).is_relative_to(where) or where.is_relative_to(state)
    ]
    return min(reached, key=len, default="")


def protected(config: SiteConfig) -> list[str]:
    """The directories no bind may reach: the configuration's state directories, and the checked
    squash files and squashfuse mounts kept with the unpacked copies (beside them by default)."""
    with_copies = node_state_dir(config.squash_unpack_dir)
    return [*config.state_dirs(), str(with_copies / VERIFIED_DIR), str(with_copies / MOUNTS_DIR)]


def _capabilities(options: Sequence[tuple[str, str]], flag: str) -> set[str]:
    """The capabilities named by every ``flag`` option (``--cap-add``/``--cap-drop``), as podman reads
    them: comma-separated, any case, with or without ``CAP_``."""
    return {
        name.strip().upper().removeprefix("CAP_")
        for given, value in options
        if given == flag
        for name in value.split(",")
        if name.strip()
    }


def _given(options: Sequence[tuple[str, str]], flag: str, values: Sequence[str]) -> bool:
    """Whether one of ``options`` is ``flag`` with one of ``values``."""
    return any(given == flag and value in values for given, value in options)


def host_pid_with_ptrace(options: Sequence[tuple[str, str]]) -> bool:
    """Whether ``options`` share the host's pid namespace and give the container SYS_PTRACE (podman
    merges --cap-add and --cap-drop, a named capability over ALL; --privileged gives every one)."""
    if not _given(options, "--pid", ("host",)):
        return False
    added, dropped = _capabilities(options, "--cap-add"), _capabilities(options, "--cap-drop")
    privileged = _given(options, "--privileged", ("", "true"))
    return _ptrace_added(privileged, added, dropped) and _ptrace_not_dropped(added, dropped)


def _ptrace_added(privileged: bool, added: set[str], dropped: set[str]) -> bool:
    """Whether the options give SYS_PTRACE: --privileged, by name, or with ALL unless dropped by name."""
    return privileged or PTRACE in added or ("ALL" in added and PTRACE not in dropped)


def _ptrace_not_dropped(added: set[str], dropped: set[str]) -> bool:
    """Whether no --cap-drop takes SYS_PTRACE away (by name, or as ALL unless added by name)."""
    return PTRACE not in dropped and not ("ALL" in dropped and PTRACE not in added)


def guard(config: SiteConfig, options: Sequence[tuple[str, str]], environ: Mapping[str, str]) -> list[str]:
    """The options a container of ``options`` (``(flag, value)``: the modules' and the user's) also
    gets: the user's own /dev/shm when it would share the host's. InvalidInput, in one line, when one
    of its binds would reach the engine's state."""
    wanted = binds(options)
    extra = _private_shm_for_host_ipc(options, wanted, environ)
    if extra:
        wanted += binds([("-v", extra[1])])
    if host_pid_with_ptrace(options):
        raise InvalidInput(
            "--pid=host with SYS_PTRACE (--privileged or --cap-add) would let the container read "
            "and trace your processes on the host, their environment included: drop one of them "
            "(add --cap-drop=SYS_PTRACE to keep the other capabilities, as the MPI modules do)"
        )
    _refuse_state_binds(wanted, protected(config))
    return extra


def _private_shm_for_host_ipc(
    options: Sequence[tuple[str, str]], wanted: Sequence[Bind], environ: Mapping[str, str]
) -> list[str]:
    """``-v PRIVATE:/dev/shm`` for a container that shares the host's IPC namespace and mounts nothing
    of its own at /dev/shm; [] otherwise."""
    if not _given(options, "--ipc", ("host",)):
        return []
    if any(os.path.normpath(bind.target) == HOST_SHM for bind in wanted if bind.target):
        return []
    return ["-v", f"{private_shm(environ)}:{HOST_SHM}"]


def _refuse_state_binds(wanted: Sequence[Bind], state_dirs: Sequence[str]) -> None:
    """InvalidInput, in one line, for the first bind that would reach one of ``state_dirs``."""
    for bind in wanted:
        state = bind.source and reached_state(bind.source, state_dirs)
        if state:
            raise InvalidInput(
                f"{bind.option} would give the container podman-hpc's own state ({state}): "
                f"bind a directory of your own (--ipc=host alone shares /dev/shm between your "
                f"containers)"
            )
