"""Site modules: podman-hpc's ``modules.d/*.yaml``, turned into podman arguments.

A module selected on the command line (``--<cli_arg>``) contributes its
``additional_args``, ``-e <env>=1`` (which the OCI hook uses to find the
module's ``copy`` entries) and its ``bind`` entries as ``-v`` mounts
(sources globbed and expanded from the caller's environment; a source that
does not exist on this node is skipped). A bind rule may end in podman's
``:ro`` (or ``:rw``), our addition to podman-hpc's ``src:dst`` form: a
module that mounts the user's own files (the ``slurm`` module's uid shim)
mounts them read-only, so that no image can replace what later containers
use. ``$PODMANHPC_PRIVATE_SHM`` in a bind rule is the user's own
directory for shared memory (``/dev/shm/<uid>_hpc/ipc``, made or verified
0700 when a module uses it): the MPI modules bind it at ``/dev/shm``
instead of the host's ``/dev/shm``, where the engine keeps its unpacked
images. Unlike podman-hpc, which only warns, a conflicting pair or a
missing dependency is an error.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ..base.files import atomic_write
from ..base.private import private_dir
from ..errors import ModuleError
from . import hostslurm

FIELDS = {
    "name",
    "cli_arg",
    "help",
    "env",
    "additional_args",
    "bind",
    "copy",
    "conflicts",
    "depends_on",
    "shared_run",
    "hidden",
    "cdi_devices",
}
HOOK_ANNOTATION = "podman_hpc.hook_tool"  # the annotation podman-hpc's hooks.d entry matches
# Where container runtimes look for Container Device Interface specs.
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
BIND_OPTIONS = ("ro", "rw")  # what a bind rule may end in (podman -v's options)
PRIVATE_SHM = "PODMANHPC_PRIVATE_SHM"  # bind rules' name for the user's own shared-memory directory


@dataclass(frozen=True)
class Module:
    name: str
    env: str
    cli_arg: str = ""
    help: str = ""
    additional_args: tuple[str, ...] = ()
    bind: tuple[str, ...] = ()
    copy: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    depends_on: tuple[str, ...] = ()
    shared_run: bool = False
    hidden: bool = False
    cdi_devices: tuple[str, ...] = ()  # ours: "--device X" when a CDI spec defines X's kind
    path: str = field(default="", compare=False)

    @property
    def flag(self) -> str:
        """The run option that turns the module on (``--<cli_arg>``)."""
        return f"--{self.cli_arg}"

    def podman_args(self) -> list[str]:
        """``additional_args`` as argv; podman-hpc's "-e X" items become two words."""
        args: list[str] = []
        for item in self.additional_args:
            args.extend(shlex.split(item))
        return args

    def describe(self) -> dict:
        """What a front lists of the module: name, flag (empty when it has none), help, conflicts,
        dependencies, shared_run, hidden."""
        return {
            "name": self.name,
            "flag": self.flag if self.cli_arg else "",
            "help": self.help,
            "conflicts": list(self.conflicts),
            "depends_on": list(self.depends_on),
            "shared_run": self.shared_run,
            "hidden": self.hidden,
        }


def _strings(data: dict, key: str, path: Path) -> tuple[str, ...]:
    value = data.get(key) or []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ModuleError(f"module file {path}: '{key}' must be a list of strings")
    return tuple(value)


def load_module(path: Path) -> Module:
    """The module a site's YAML file defines, checked (keys, required name and env, bind and copy rules);
    ModuleError with one line naming the file otherwise."""
    data = _read_yaml(path)
    for check in _MODULE_CHECKS:
        check(data, path)
    return Module(
        name=data["name"],
        env=data["env"],
        cli_arg=str(data.get("cli_arg") or ""),
        help=str(data.get("help") or ""),
        additional_args=_strings(data, "additional_args", path),
        bind=_strings(data, "bind", path),
        copy=_strings(data, "copy", path),
        conflicts=_strings(data, "conflicts", path),
        depends_on=_strings(data, "depends_on", path),
        shared_run=bool(data.get("shared_run")),
        hidden=bool(data.get("hidden")),
        cdi_devices=_strings(data, "cdi_devices", path),
        path=str(path),
    )


def _read_yaml(path: Path) -> Any:
    """A module file's YAML data; ModuleError when it cannot be read or parsed."""
    import yaml  # here, not at the top: a cached module set does not need it

    from .config import yaml_problem

    try:
        return yaml.safe_load(path.read_text())
    except OSError as err:
        raise ModuleError(f"cannot read module file {path}: {err.strerror or err}")
    except yaml.YAMLError as err:
        raise ModuleError(f"module file {path} is not valid YAML: {yaml_problem(err)}")


def _check_mapping(data: Any, path: Path) -> None:
    if not isinstance(data, dict):
        raise ModuleError(f"module file {path} must be a mapping")


def _check_keys(data: dict, path: Path) -> None:
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise ModuleError(
            f"module file {path}: unknown key '{unknown[0]}' (a module's keys: {', '.join(sorted(FIELDS))})"
        )


def _check_required(data: dict, path: Path) -> None:
    for required in ("name", "env"):
        if not isinstance(data.get(required), str) or not data[required]:
            raise ModuleError(f"module file {path}: '{required}' is required")


def _check_binds(data: dict, path: Path) -> None:
    for rule in _strings(data, "bind", path):
        split_rule(rule, f"module file {path}: bind rule")


def _check_copies(data: dict, path: Path) -> None:
    for rule in _strings(data, "copy", path):
        if split_rule(rule, f"module file {path}: copy rule")[2]:
            raise ModuleError(f"module file {path}: copy rule '{rule}': options such as ':ro' apply to bind rules only")


# A module file's checks, in the order they are made (the first that fails is the one reported).
_MODULE_CHECKS = (_check_mapping, _check_keys, _check_required, _check_binds, _check_copies)


def _cached_module(fields: dict[str, Any]) -> Module:
    """A module as the cache of ``ModuleSet.load`` holds it (JSON: its tuples are lists)."""
    kept: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
    return Module(**kept)


@dataclass(frozen=True)
class ModuleSet:
    """All modules of a site, by name, in file-name order."""

    directory: str
    modules: tuple[Module, ...]

    @classmethod
    def load(cls, directory: str, cache_dir: str | None = None) -> ModuleSet:
        """The modules of ``directory``; with ``cache_dir``, parsed once per change of the files
        (every task of a job step loads them)."""
        root = Path(directory)
        if not root.is_dir():
            return cls(directory, ())
        files = sorted(root.glob("*.yaml"))
        stamp = [[str(p), p.stat().st_mtime_ns, p.stat().st_size] for p in files]
        cache = Path(cache_dir, "modules-cache.json") if cache_dir else None
        cached = _read_cache(cache, directory, stamp) if cache is not None else None
        if cached is not None:
            return cls(directory, cached)
        modules = tuple(load_module(p) for p in files)
        _refuse_duplicates(modules, directory)
        if cache is not None:
            _write_cache(cache, directory, stamp, modules)
        return cls(directory, modules)

    def __iter__(self):
        return iter(self.modules)

    def by_name(self, name: str) -> Module:
        """The module called ``name`` (or whose ``cli_arg`` it is); ModuleError listing the available ones
        otherwise."""
        for module in self.modules:
            if name in (module.name, module.cli_arg):
                return module
        known = ", ".join(m.name for m in self.modules) or "none"
        raise ModuleError(f"unknown module '{name}' (available: {known})")

    def by_flag(self) -> dict[str, Module]:
        """The modules that have a run option, by that option (``--gpu``: the module)."""
        return {m.flag: m for m in self.modules if m.cli_arg}

    def select(self, names: Iterable[str]) -> list[Module]:
        """The named modules, checked for conflicts and dependencies."""
        chosen: list[Module] = []
        for module in map(self.by_name, names):
            if module not in chosen:
                chosen.append(module)
        enabled = {m.name for m in chosen}
        for module in chosen:
            self._refuse_conflicts(module, enabled)
            self._refuse_missing(module, enabled)
        return chosen

    def _refuse_conflicts(self, module: Module, enabled: set[str]) -> None:
        """ModuleError when a module it conflicts with is enabled too."""
        for other in module.conflicts:
            if other in enabled:
                raise ModuleError(
                    f"module '{module.name}' ({module.flag}) conflicts with '{other}' "
                    f"({self.by_name(other).flag}): use only one of them"
                )

    def _refuse_missing(self, module: Module, enabled: set[str]) -> None:
        """ModuleError, naming the flag to add, when a module it depends on is not enabled."""
        for needed in module.depends_on:
            if needed not in enabled:
                flag = next((m.flag for m in self.modules if m.name == needed), f"'{needed}'")
                raise ModuleError(f"module '{module.name}' ({module.flag}) needs '{needed}': add {flag}")

    def podman_args(self, chosen: Iterable[Module], environ: Mapping[str, str] | None = None) -> list[str]:
        """The podman run arguments of the chosen modules, in order.

        When a module has ``copy`` entries, the container also gets the OCI
        hook's annotation and the modules directory (as podman-hpc gives every
        container; we only pay for the hook when there is something to copy).
        """
        env = os.environ if environ is None else environ
        chosen = list(chosen)
        args: list[str] = []
        if any(module.copy for module in chosen):
            args += ["--annotation", f"{HOOK_ANNOTATION}=true", "--env", f"PODMANHPC_MODULES_DIR={self.directory}"]
        env = _bind_environment(chosen, env)
        for module in chosen:
            args += _module_run_args(module, self.directory, env)
        return args


def _read_cache(cache: Path, directory: str, stamp: list) -> tuple[Module, ...] | None:
    """The modules the cache holds for these files (``stamp``), or None when it holds none that fit."""
    try:
        cached = json.loads(cache.read_text())
        if cached["directory"] == directory and cached["stamp"] == stamp:
            return tuple(_cached_module(m) for m in cached["modules"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _refuse_duplicates(modules: tuple[Module, ...], directory: str) -> None:
    names = [m.name for m in modules]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise ModuleError(f"two module files in {directory} define the module '{duplicate}'")


def _write_cache(cache: Path, directory: str, stamp: list, modules: tuple[Module, ...]) -> None:
    """The parsed modules for the next load; a cache that cannot be written is only slower."""
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        record = {"directory": directory, "stamp": stamp, "modules": [asdict(m) for m in modules]}
        atomic_write(cache, json.dumps(record))
    except OSError:
        pass


def _binds_use(chosen: list[Module], variable: str) -> bool:
    """Whether a bind rule of the chosen modules names ``variable``."""
    return any(variable in rule for module in chosen for rule in module.bind)


def _bind_environment(chosen: list[Module], env: Mapping[str, str]) -> Mapping[str, str]:
    """``env`` with what the chosen modules' bind rules name and the engine provides: the user's private
    shared-memory directory, the uid shim (unless the caller set one)."""
    if _binds_use(chosen, PRIVATE_SHM):
        env = {**env, PRIVATE_SHM: private_shm(env)}
    if not env.get(hostslurm.SHIM_VARIABLE) and _binds_use(chosen, hostslurm.SHIM_VARIABLE):
        shim = hostslurm.uid_shim(env)  # built once per user; None (logged) without a compiler
        if shim:
            env = {**env, hostslurm.SHIM_VARIABLE: shim}
    return env


def _module_run_args(module: Module, directory: str, env: Mapping[str, str]) -> list[str]:
    """One module's podman run arguments: its own, its variable, its CDI devices, its binds."""
    args = [*module.podman_args(), "-e", f"{module.env}=1"]
    for device in module.cdi_devices:
        if cdi_kind_available(device.split("=", 1)[0]):
            args += ["--device", device]
    for mount in resolve_binds(module.bind, directory, env):
        args += ["-v", ":".join(filter(None, mount))]
    return args


def private_shm(environ: Mapping[str, str]) -> str:
    """The user's own directory for shared-memory segments on this node, made or verified 0700
    (``/dev/shm`` is everyone's: another user could have made it first, to read the segments).
    The MPI modules bind it at ``/dev/shm``, and so does every other ``--ipc=host`` container
    (``statebinds``): the host's ``/dev/shm`` holds the engine's unpacked images."""
    return str(private_dir(environ.get(PRIVATE_SHM) or f"/dev/shm/{os.getuid()}_hpc/ipc"))


def cdi_kind_available(kind: str, directories: Iterable[str] = CDI_DIRS) -> bool:
    """Whether a CDI spec on this node declares devices of ``kind`` (e.g. nvidia.com/gpu)."""
    pattern = re.compile(rf"""["']?kind["']?\s*:\s*["']?{re.escape(kind)}["']?""")
    for directory in directories:
        for spec in sorted(Path(directory).glob("*.*")):
            if spec.suffix in (".yaml", ".yml", ".json"):
                try:
                    if pattern.search(spec.read_text()):
                        return True
                except OSError:
                    continue
    return False


_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)\}")


def _expand(path: str, env: Mapping[str, str]) -> str:
    """$VAR, ${VAR} and a leading ~ from the caller's environment; unset ones stay."""
    path = _VARIABLE.sub(lambda m: env.get(m.group(1) or m.group(2), m.group(0)), path)
    if path.startswith("~") and env.get("HOME"):
        path = env["HOME"] + path[1:]
    return path


class Mount(NamedTuple):
    """One resolved rule: a host path, the path in the container, podman -v's options."""

    source: str
    target: str
    options: str = ""


def split_rule(rule: str, what: str = "bind rule") -> tuple[str, str, str]:
    """``src[:dst[:ro|rw]]`` as (src, dst, options), unexpanded."""
    src, _, dst = rule.partition(":")
    options = ""
    if ":" in dst:
        dst, _, options = dst.rpartition(":")
        if options not in BIND_OPTIONS:
            raise ModuleError(
                f"{what} '{rule}': unknown option '{options}' (use {' or '.join(':' + o for o in BIND_OPTIONS)})"
            )
    return src, dst, options


def resolve_binds(rules: Iterable[str], modules_dir: str, env: Mapping[str, str]) -> list[Mount]:
    """podman-hpc's ``src:dst`` rules (with our optional ``:ro``) as mounts.

    ``dst`` empty means the same path; a ``dst`` ending in ``/`` receives the
    source's base name; a ``*`` in ``dst`` takes what the ``*`` of ``src``
    matched. Sources that match nothing are skipped.
    """
    return [mount for rule in rules for mount in _resolve_rule(rule, modules_dir, env)]


def _resolve_rule(rule: str, modules_dir: str, env: Mapping[str, str]) -> list[Mount]:
    """The mounts of one bind rule: one per match of its (expanded) source."""
    src, dst, options = split_rule(rule)
    src, dst = _expand(src, env), _expand(dst, env)
    if "$" in src or "$" in dst:
        return []  # a variable this environment does not set: nothing to mount
    if not os.path.isabs(src):
        src = os.path.abspath(os.path.join(modules_dir, src))
    if dst and not os.path.isabs(dst):
        raise ModuleError(f"bind rule '{rule}': the container path must be absolute")
    matches = sorted(glob.glob(src))
    return [Mount(match, os.path.normpath(_target(src, dst, match)), options) for match in matches]


def _target(src: str, dst: str, match: str) -> str:
    """Where one match of a rule's source ``src`` goes in the container (before normalizing)."""
    if not dst:
        return match
    prefix, star, suffix = src.partition("*")
    if "*" in dst and star:
        part = match[len(prefix) : len(match) - len(suffix) if suffix else None]
        target = dst.replace("*", part)
        return target + os.path.basename(match) if dst.endswith("/") else target
    if dst.endswith("/"):
        return dst + os.path.basename(match)
    return dst
