"""The site configuration: podman-hpc's ``podman_hpc.yaml`` keys, templates and variables.

Each key's value comes from, lowest to highest precedence: the built-in
default, ``<key>_template`` in the file, ``PODMANHPC_<KEY>_TEMPLATE``,
``<key>`` in the file, ``PODMANHPC_<KEY>``; for ``squash_dir`` then
``SQUASH_DIR`` and ``--squash-dir``. Templates may use ``{{ uid }}``,
``{{ user }}`` and ``{{ env.NAME }}``. The file is ``$PODMANHPC_CONFIG_FILE``
or ``/etc/podman_hpc/podman_hpc.yaml``. Unknown keys in the file are errors.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..text import truth
from .readpath import (
    DEFAULT_AUTO_JOB_MAX_MB,
    DEFAULT_BUDGET,
    DEFAULT_IDLE_MINUTES,
    DEFAULT_LOGIN_BUDGET,
    ReadPathSettings,
    budget_mb,
)
from .readpath import (
    MODES as READ_PATHS,
)

NO_SQUASH_DIR = (
    "no squashed image store: SCRATCH is not set and no squash_dir, SQUASH_DIR or --squash-dir "
    "names one (podman-hpc's fallback /tmp/storage would be shared with every user of the node)"
)
DEFAULT_CONFIG_FILE = "/etc/podman_hpc/podman_hpc.yaml"
SITE_DATA = Path(__file__).resolve().parent / "data"

# Keys that may also be given as <key>_template in the file or the environment.
TEMPLATED = {
    "graph_root",
    "run_root",
    "additional_stores",
    "config_home",
    "squash_dir",
    "shared_run_exec_args",
    "squash_unpack_dir",
}
# podman-hpc's name for the shared_run_exec_args template.
TEMPLATE_ALIASES = {"shared_run_args_template": "shared_run_exec_args"}


def _script(name: str) -> str:
    """A console script of this package: beside the interpreter, else on PATH."""
    sibling = Path(sys.executable).parent / name
    if sibling.exists():
        return str(sibling)
    return shutil.which(name) or name


@dataclass
class SiteConfig:
    """The effective configuration; ``sources`` says where each value came from."""

    # podman-hpc 1.2.2's keys
    podman_bin: str = "podman"
    mount_program: str = ""
    modules_dir: str = str(SITE_DATA / "modules.d")
    shared_run_exec_args: list[str] = field(
        default_factory=lambda: [
            "-e",
            "SLURM_*",
            "-e",
            "SLURMD_*",
            "-e",
            "PALS_*",
            "-e",
            "PMI_*",
            "-e",
            "PMIX_*",
            "-e",
            "OMPI_*",
        ]
    )
    shared_run_command: list[str] = field(default_factory=lambda: ["sleep", "infinity"])
    shared_run_exec_mode: str = "join"  # ours: "podman" enters the container with podman exec
    shared_run_reuse: bool = False  # ours: a job's steps share its node container (engine/run/jobcontainer.py)
    shared_run_reuse_linger: float = 30.0  # seconds that container waits for the job's next step
    graph_root: str = "/tmp/{{ uid }}_hpc/storage"
    run_root: str = "/tmp/{{ uid }}_hpc"
    additional_stores: list[str] = field(default_factory=list)
    hooks_dir: str = ""
    config_home: str = "/tmp/{{ uid }}_hpc/config"
    localid_var: str = "SLURM_LOCALID"
    tasks_per_node_var: str = "SLURM_STEP_TASKS_PER_NODE"
    ntasks_pattern: str = "[0-9]+"
    wait_timeout: float = 10.0
    wait_poll_interval: float = 0.2
    use_default_args: bool = True
    mksquashfs_bin: str = "mksquashfs"
    # our own keys
    squash_dir: str = ""
    mksquashfs_args: list[str] = field(default_factory=lambda: ["-comp", "lz4"])
    # the read path of squashed images (engine/site/readpath.py)
    squash_read_path: str = "auto"
    squash_unpack_dir: str = "/dev/shm/{{ uid }}_hpc/unpacked"
    squash_unpack_max_mb: str = DEFAULT_BUDGET  # MiB, or "N%" of the node's (the job's) memory
    squash_unpack_idle_minutes: float = DEFAULT_IDLE_MINUTES  # an unused copy is removed after this
    # the budget instead on a login node (no SLURM_JOB_ID), where only squash_read_path: unpacked unpacks
    squash_unpack_login_max_mb: str = DEFAULT_LOGIN_BUDGET
    # auto unpacks no image whose unpacking makes the job's nodes read more than this (MiB) from the store
    squash_unpack_auto_job_max_mb: float = DEFAULT_AUTO_JOB_MAX_MB
    runtime: str = ""
    cgroup_manager: str = "cgroupfs"
    network: str = ""
    ulimits: list[str] = field(default_factory=list)
    log_level: str = "error"
    hook_tool: str = ""

    user: str = field(default="", metadata={"derived": True})
    uid: int = field(default=-1, metadata={"derived": True})
    config_file: str = field(default="", metadata={"derived": True})
    # the Slurm job we run in, "" outside one (a login node): the unpack policy differs
    slurm_job_id: str = field(default="", metadata={"derived": True})
    slurm_job_nodes: int = field(default=0, metadata={"derived": True})
    sources: dict[str, str] = field(default_factory=dict, metadata={"derived": True})

    @classmethod
    def keys(cls) -> list[str]:
        """The keys a site configuration file may set, in field order (not those derived at load time: user,
        uid, sources...)."""
        return [f.name for f in fields(cls) if not f.metadata.get("derived")]

    def as_dict(self) -> dict[str, Any]:
        """The settable keys and their values, as a configuration file would write them."""
        return {key: getattr(self, key) for key in self.keys()}

    def podman_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment podman runs with, as podman-hpc gives it.

        XDG_CONFIG_HOME points at ``config_home`` so the user's own podman
        configuration does not leak in; XDG_RUNTIME_DIR is dropped so podman
        keeps its runtime files on the node.
        """
        env = dict(os.environ if base is None else base)
        env.pop("XDG_RUNTIME_DIR", None)
        env["XDG_CONFIG_HOME"] = self.config_home
        env.update(self.read_path.env())  # for the mount program podman runs
        return env

    def state_dirs(self) -> list[str]:
        """The per-user directories podman and the engine keep state in (engine/base/private.py)."""
        dirs = [self.config_home]  # XDG_CONFIG_HOME: podman reads containers.conf there
        if self.use_default_args:
            dirs += [self.run_root, self.graph_root]
            if self.sources.get("hooks_dir", "").startswith("default"):
                dirs.append(self.hooks_dir)
        # the unpacked copies, with the squashfuse mounts' references and the checked squash files (node_state_dir)
        return [*dirs, self.squash_unpack_dir]

    def prepare_state(self) -> None:
        """Make or verify every per-user state directory; UnsafeDirectory if one is not safe.
        A hooks directory the site set is only checked: root's or the user's, nobody else's."""
        from ..base.private import private_dir, trusted_dir

        for directory in self.state_dirs():
            private_dir(directory)
        if self.use_default_args and not self.sources.get("hooks_dir", "").startswith("default"):
            (trusted_dir if os.path.isdir(self.hooks_dir) else private_dir)(self.hooks_dir)

    @property
    def read_path(self) -> ReadPathSettings:
        """The read-path settings this configuration gives the mount program on this node (the budget that
        applies here: login node or job)."""
        return ReadPathSettings(
            self.squash_read_path,
            self.squash_unpack_dir,
            budget_mb(self.budget_key[1]),
            self.squash_unpack_idle_minutes,
            self.slurm_job_id,
            self.slurm_job_nodes,
            self.squash_unpack_auto_job_max_mb,
        )

    @property
    def budget_key(self) -> tuple[str, str]:
        """(the budget key that applies on this node, its value)."""
        key = "squash_unpack_max_mb" if self.slurm_job_id else "squash_unpack_login_max_mb"
        return key, getattr(self, key)


_LIST_KEYS = {f.name for f in fields(SiteConfig) if f.type in ("list[str]",)}
_FLOAT_KEYS = {
    "wait_timeout",
    "wait_poll_interval",
    "squash_unpack_idle_minutes",
    "shared_run_reuse_linger",
    "squash_unpack_auto_job_max_mb",
}
_BOOL_KEYS = {"use_default_args", "shared_run_reuse"}
_PLACEHOLDER = re.compile(r"{{\s*([^}]*?)\s*}}")


def load_config(
    environ: Mapping[str, str] | None = None, *, squash_dir: str | None = None, config_file: str | None = None
) -> SiteConfig:
    """Build the effective configuration from defaults, the file and the environment."""
    env = dict(os.environ if environ is None else environ)
    user = _user_name(env)
    uid = os.getuid()
    path = config_file or env.get("PODMANHPC_CONFIG_FILE") or DEFAULT_CONFIG_FILE
    from_file = _read_file(path, explicit=bool(config_file or env.get("PODMANHPC_CONFIG_FILE")))

    config = SiteConfig(
        user=user,
        uid=uid,
        config_file=path if from_file is not None else "",
        slurm_job_id=env.get("SLURM_JOB_ID", ""),
        slurm_job_nodes=_job_nodes(env),
    )
    given = _Given(from_file or {}, env, squash_dir, user, uid)
    defaults = _defaults(config, env)
    for key in SiteConfig.keys():  # noqa: SIM118  a class, no dict: keys() lists the settings a file may set
        value, source = _value_of(key, defaults[key], given)
        setattr(config, key, _coerce(key, value, source))
        config.sources[key] = source
    if not config.hooks_dir:
        config.hooks_dir = f"{config.run_root}/hooks.d"
        config.sources["hooks_dir"] = "default: <run_root>/hooks.d"
    _validate(config)
    return config


@dataclass(frozen=True)
class _Given:
    """What ``load_config`` takes a key's value from besides its default, lowest precedence first."""

    from_file: Mapping[str, Any]
    env: Mapping[str, str]
    squash_dir: str | None  # --squash-dir
    user: str
    uid: int

    def templates(self, key: str) -> list[tuple[Any, str]]:
        """(template or None, where) for ``key``: the file's (or its podman-hpc alias), then the environment's."""
        if key not in TEMPLATED:
            return []
        template_key = f"{key}_template"
        file_template = self.from_file.get(template_key)
        if file_template is None:
            file_template = next(
                (self.from_file[a] for a, k in TEMPLATE_ALIASES.items() if k == key and a in self.from_file), None
            )
        variable = f"PODMANHPC_{template_key.upper()}"
        return [(file_template, f"file: {template_key}"), (self.env.get(variable), f"env: {variable}")]

    def settings(self, key: str) -> list[tuple[Any, str]]:
        """(value or None, where) for ``key``: the file's, then ``PODMANHPC_<KEY>``."""
        return [
            (self.from_file.get(key), f"file: {key}"),
            (self.env.get(f"PODMANHPC_{key.upper()}"), f"env: PODMANHPC_{key.upper()}"),
        ]

    def overrides(self, key: str) -> list[tuple[str | None, str]]:
        """(value, where) that win over the settings when not empty: SQUASH_DIR and --squash-dir."""
        if key != "squash_dir":
            return []
        return [(self.env.get("SQUASH_DIR"), "env: SQUASH_DIR"), (self.squash_dir, "option: --squash-dir")]

    def expand(self, raw: Any, key: str, where: str) -> Any:
        """``raw`` (a template, or a default with placeholders) with its placeholders filled in."""
        return _expand(raw, key, where, self.user, self.uid, self.env)


def _defaults(config: SiteConfig, env: Mapping[str, str]) -> dict[str, Any]:
    """Each key's built-in default, with those found at load time: the console scripts and the store."""
    defaults = config.as_dict()
    defaults["mount_program"] = _script("podman-hpc-mount")
    defaults["hook_tool"] = _script("podman-hpc-hook")
    # podman-hpc 1.2.2 falls back to /tmp/storage, one store every user of the node shares
    defaults["squash_dir"] = f"{env['SCRATCH']}/storage" if env.get("SCRATCH") else ""
    return defaults


def _value_of(key: str, default: Any, given: _Given) -> tuple[Any, str]:
    """(``key``'s raw value, where it came from): the last one given, in order of precedence, else the
    default; every template given is expanded (a bad one is an error even when a later one wins)."""
    value, source = default, "default"
    for raw, where in given.templates(key):
        if raw is not None:
            value, source = given.expand(raw, key, where), where
    for raw, where in given.settings(key):
        if raw is not None:
            value, source = raw, where
    for raw, where in given.overrides(key):
        if raw:
            value, source = raw, where
    if source == "default" and isinstance(value, str) and "{{" in value:
        value = given.expand(value, key, source)
    return value, source


def _user_name(env: Mapping[str, str]) -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return env.get("USER") or str(os.getuid())


def _read_file(path: str, explicit: bool) -> dict[str, Any] | None:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"configuration file {path} does not exist (PODMANHPC_CONFIG_FILE)")
        return None
    except OSError as err:
        raise ConfigError(f"cannot read configuration file {path}: {err.strerror}")
    import yaml  # only when there is a file: every Slurm task loads the configuration

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"configuration file {path} is not valid YAML: {yaml_problem(err)}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"configuration file {path} must be a mapping of keys to values")
    known = set(SiteConfig.keys()) | {f"{k}_template" for k in TEMPLATED} | set(TEMPLATE_ALIASES)
    for key in data:
        if key not in known:
            raise ConfigError(f"unknown key '{key}' in configuration file {path}")
    return data


def yaml_problem(err: Exception) -> str:
    """A YAML parser's error in one line: where (1-based line and column) and what, without the
    excerpt of the file it quotes over several lines (the site's files: config and modules)."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    if mark is None:
        return problem
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"


def _expand(raw: Any, key: str, where: str, user: str, uid: int, env: Mapping[str, str]) -> Any:
    if isinstance(raw, list):
        return [_expand(item, key, where, user, uid, env) for item in raw]
    if not isinstance(raw, str):
        raise ConfigError(f"{key} ({where}) must be a string or a list of strings")

    def substitute(match: re.Match) -> str:
        name = match.group(1)
        if name == "uid":
            return str(uid)
        if name == "user":
            return user
        if name.startswith("env."):
            var = name[4:]
            if var not in env:
                raise ConfigError(f"{key} ({where}) uses {{{{ env.{var} }}}} but {var} is not set")
            return env[var]
        raise ConfigError(f"{key} ({where}) has an unknown placeholder {{{{ {name} }}}}")

    return _PLACEHOLDER.sub(substitute, raw)


def _coerce(key: str, value: Any, source: str) -> Any:
    where = f"{key} ({source})"
    for keys, coerce in _COERCIONS:
        if key in keys:
            return coerce(value, where)
    return _as_string(value, where)


def _as_list(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        # podman-hpc's convention for lists in variables and strings: commas.
        return [item for item in value.split(",") if item != ""]
    if isinstance(value, list) and all(isinstance(item, (str, int, float)) for item in value):
        return [str(item) for item in value]
    raise ConfigError(f"{where} must be a list of strings")


def _as_positive_float(value: Any, where: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where} must be a number, not {value!r}")
    if number <= 0:
        raise ConfigError(f"{where} must be positive")
    return number


def _as_bool(value: Any, where: str) -> bool:
    flag = truth(value)
    if flag is not None:
        return flag
    raise ConfigError(f"{where} must be true or false, not {value!r}")


def _as_string(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, (str, int, float)):
        raise ConfigError(f"{where} must be a string")
    return str(value)


# Which keys take which type, checked in this order (a key in none of them is a string).
_COERCIONS: tuple[tuple[set[str], Callable[[Any, str], Any]], ...] = (
    (_LIST_KEYS, _as_list),
    (_FLOAT_KEYS, _as_positive_float),
    (_BOOL_KEYS, _as_bool),
)


def _job_nodes(env: Mapping[str, str]) -> int:
    """The node count of the Slurm job we run in (0 outside one, or when Slurm does not say)."""
    value = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or ""
    return int(value) if value.isdigit() else 0


def _validate(config: SiteConfig) -> None:
    try:
        re.compile(config.ntasks_pattern)
    except re.error as err:
        raise ConfigError(
            f"ntasks_pattern ({config.sources['ntasks_pattern']}) is not a valid regular expression: {err}"
        )
    if config.shared_run_exec_mode not in ("podman", "join"):
        raise ConfigError(
            f"shared_run_exec_mode ({config.sources['shared_run_exec_mode']}) "
            f"must be podman or join, not {config.shared_run_exec_mode!r}"
        )
    if config.squash_read_path not in READ_PATHS:
        raise ConfigError(
            f"squash_read_path ({config.sources['squash_read_path']}) must be one of "
            f"{', '.join(READ_PATHS)}, not {config.squash_read_path!r}"
        )
    for key in ("squash_unpack_max_mb", "squash_unpack_login_max_mb"):
        try:
            budget_mb(getattr(config, key))
        except ValueError:
            raise ConfigError(
                f"{key} ({config.sources[key]}) must be a positive number of MiB or a share of "
                f"memory such as 10%, not {getattr(config, key)!r}"
            )
    for key in ("graph_root", "run_root", "squash_dir", "config_home", "hooks_dir", "squash_unpack_dir"):
        if key == "squash_dir" and not config.squash_dir:
            continue  # no personal store: commands that need one refuse (NO_SQUASH_DIR)
        if not os.path.isabs(getattr(config, key)):
            raise ConfigError(f"{key} ({config.sources[key]}) must be an absolute path, not {getattr(config, key)!r}")
