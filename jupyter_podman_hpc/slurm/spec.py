"""JobSpec: what a Slurm job runs and on what resources, validated field by field.

Every value of a spec ends up in a batch script, so every value is checked
where it enters: a bad one raises ``JobSpecError`` with one sentence naming
the field. No value may hold a newline or a NUL (each would start a new
line of the script); names Slurm parses itself (job name, partition, ...)
are limited to the characters Slurm allows; ``extra_directives`` come from
an allow-list of sbatch options. The module names are checked against the
site's modules when the script is rendered (``check_modules``), since that
needs the site configuration.
"""

from __future__ import annotations

import ast
import dataclasses
import keyword
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import PurePosixPath
from typing import Any

from ..engine import reference
from ..engine.errors import EngineError, InvalidInput, ModuleError
from ..engine.site.modules import Module, ModuleSet

MODES = ("podman-exec", "per-process")
NOTEBOOK_MAGICS = ("ipython", "comment")

# srun's MPI plugin for the site modules that need one.
SRUN_MPI = {"openmpi-pmix": "pmix", "openmpi-pmi2": "pmi2"}

# sbatch options a spec sets through its own fields: a directive naming one is refused.
MANAGED = {
    "job-name": "job_name",
    "nodes": "nodes",
    "ntasks-per-node": "tasks_per_node",
    "cpus-per-task": "cpus_per_task",
    "gpus-per-node": "gpus_per_node",
    "time": "time",
    "partition": "partition",
    "account": "account",
    "qos": "qos",
    "reservation": "reservation",
    "export": "environment",
    "chdir": "workdir (the batch script runs in the job directory)",
    "output": "the job directory (slurm-%j.out)",
    "error": "the job directory (slurm-%j.out)",
    "ntasks": "nodes and tasks_per_node",
}

# sbatch options allowed as extra directives: resources, placement, scheduling and
# notification. Left out on purpose: those that change what the job is (--array,
# --wrap, --het-job), where it is recorded (--clusters), or who runs it (--uid, --gid).
ALLOWED_DIRECTIVES = frozenset(
    [
        "begin",
        "comment",
        "constraint",
        "contiguous",
        "core-spec",
        "cores-per-socket",
        "cpu-freq",
        "deadline",
        "delay-boot",
        "dependency",
        "distribution",
        "exclude",
        "exclusive",
        "extra-node-info",
        "gpu-bind",
        "gpu-freq",
        "gpus",
        "gpus-per-socket",
        "gpus-per-task",
        "gres",
        "gres-flags",
        "hint",
        "hold",
        "ignore-pbs",
        "kill-on-invalid-dep",
        "licenses",
        "mail-type",
        "mail-user",
        "mcs-label",
        "mem",
        "mem-bind",
        "mem-per-cpu",
        "mem-per-gpu",
        "mincpus",
        "network",
        "nice",
        "no-requeue",
        "nodefile",
        "nodelist",
        "ntasks-per-core",
        "ntasks-per-gpu",
        "ntasks-per-socket",
        "open-mode",
        "overcommit",
        "oversubscribe",
        "power",
        "prefer",
        "priority",
        "profile",
        "propagate",
        "reboot",
        "requeue",
        "signal",
        "sockets-per-node",
        "spread-job",
        "switches",
        "thread-spec",
        "threads-per-core",
        "time-min",
        "tmp",
        "use-min-nodes",
        "wckey",
    ]
)

# Characters Slurm names (job, partition, account, qos, reservation) may hold here.
_NAME = re.compile(r"[A-Za-z0-9_.+@:-]+")
_PARTITION = re.compile(r"[A-Za-z0-9_.-]+(?:,[A-Za-z0-9_.-]+)*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DIRECTIVE = re.compile(r"--([a-z][a-z0-9-]*)(?:=(.*))?", re.S)
# What a directive's value may contain: sbatch splits #SBATCH lines on blanks and
# interprets quotes, so those stay out (and "#", which some sbatch versions treat
# as the start of a comment).
_DIRECTIVE_VALUE = re.compile(r"[A-Za-z0-9_.,:;=@%+/\-\[\]()*!&|~^<>?$]+")
_TIME_FORMS = [
    re.compile(r"(?P<m>\d+)"),
    re.compile(r"(?P<m>\d+):(?P<s>\d{1,2})"),
    re.compile(r"(?P<h>\d+):(?P<m>\d{1,2}):(?P<s>\d{1,2})"),
    re.compile(r"(?P<d>\d+)-(?P<h>\d{1,2})"),
    re.compile(r"(?P<d>\d+)-(?P<h>\d{1,2}):(?P<m>\d{1,2})"),
    re.compile(r"(?P<d>\d+)-(?P<h>\d{1,2}):(?P<m>\d{1,2}):(?P<s>\d{1,2})"),
]
UNLIMITED = ("UNLIMITED", "INFINITE")
TIME_HELP = "use minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED"

LIMITS = {"nodes": (1, 100_000), "tasks_per_node": (1, 4096), "cpus_per_task": (1, 4096), "gpus_per_node": (0, 64)}


class JobSpecError(InvalidInput):
    """A job specification has a bad value; the message names the field."""

    exit_code = 125


# A duration field's seconds, and the bound it stays under when a larger field leads.
_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_BOUNDS = {"h": 24, "m": 60, "s": 60}


def _duration_fields(text: str) -> dict[str, int] | None:
    """The fields (d, h, m, s) of the first --time form ``text`` matches; None if none does."""
    for form in _TIME_FORMS:
        match = form.fullmatch(text)
        if match:
            return {k: int(v) for k, v in match.groupdict().items() if v is not None}
    return None


def _check_bounds(fields: dict[str, int], text: str) -> None:
    """ValueError when a field under the leading one is out of its range (``1:75``, ``2-25``)."""
    leading = next(k for k in "dhms" if k in fields)
    for key, bound in _BOUNDS.items():
        if key in fields and key != leading and fields[key] >= bound:
            raise ValueError(f"{key} out of range in {text!r}")


def duration_seconds(text: str) -> int | None:
    """Seconds in a Slurm duration (``1-02:03:04``, ``05:06``, ``7``...); None for UNLIMITED.

    Raises ValueError for anything else. The forms are those of sbatch --time,
    where a lone number is minutes and ``A:B`` is minutes:seconds.
    """
    text = text.strip()
    if text.upper() in UNLIMITED:
        return None
    fields = _duration_fields(text)
    if fields is None:
        raise ValueError(text)
    _check_bounds(fields, text)
    return sum(fields.get(key, 0) * seconds for key, seconds in _SECONDS.items())


def elapsed_seconds(text: str) -> int | None:
    """Seconds in an elapsed time as squeue/sacct print it (``1-02:03:04``, ``2:03``, ``0:00``).

    Unlike --time, a two-part value here is minutes:seconds and a three-part one
    hours:minutes:seconds, which is what ``duration_seconds`` reads too; ``INVALID``
    and the like give None.
    """
    try:
        return duration_seconds(text)
    except ValueError:
        return None


def _no_breaks(field_name: str, value: str) -> None:
    if "\n" in value or "\r" in value or "\0" in value:
        raise JobSpecError(f"{field_name} must not contain a newline, carriage return or NUL character")


def _string(field_name: str, value: Any, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise JobSpecError(f"{field_name} must be a string, not {type(value).__name__}")
    _no_breaks(field_name, value)
    return value


def _integer(field_name: str, value: Any, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobSpecError(f"{field_name} must be a whole number, not {value!r}")
    low, high = LIMITS[field_name]
    if not low <= value <= high:
        raise JobSpecError(f"{field_name} must be between {low} and {high}, not {value}")
    return value


def _name(field_name: str, value: Any, pattern: re.Pattern = _NAME) -> str | None:
    text = _string(field_name, value, optional=True)
    if text is None:
        return None
    if not text or len(text) > 200 or not pattern.fullmatch(text):
        raise JobSpecError(f"{field_name} {text!r} is not a valid Slurm name (letters, digits and _ . + @ : - only)")
    return text


def _words(field_name: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise JobSpecError(f"{field_name} must be a list of strings")
    words = tuple(value)
    for word in words:
        if not isinstance(word, str):
            raise JobSpecError(f"{field_name} must be a list of strings, not hold {word!r}")
        _no_breaks(field_name, word)
    return words


def check_parameters(parameters: Mapping[str, str]) -> dict[str, str]:
    """Names and values of parameters, each value a Python literal (``ast.literal_eval``)."""
    checked = {}
    for name, value in parameters.items():
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise JobSpecError(f"parameters: {name!r} is not a Python variable name")
        if not isinstance(value, str):
            raise JobSpecError(f"parameters: the value of {name} must be a string holding a Python literal")
        if "\n" in value or "\r" in value or "\0" in value:
            raise JobSpecError(f"parameters: the value of {name} must be one line")
        try:
            ast.literal_eval(value.strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise JobSpecError(
                f"parameters: {name}={value} is not a Python literal "
                f"(a number, True/False/None, a quoted string like {name}='text', a list...)"
            )
        checked[name] = value.strip()
    return checked


def parse_directive(text: str) -> tuple[str, str | None]:
    """``--key=value`` or ``--key`` -> (key, value), checked against the allow-list."""
    _no_breaks("extra_directives", text)
    match = _DIRECTIVE.fullmatch(text.strip())
    if not match or text != text.strip():
        raise JobSpecError(f"extra_directives: {text!r} is not an sbatch long option written as --key=value or --key")
    key, value = match.group(1), match.group(2)
    if key in MANAGED:
        raise JobSpecError(f"extra_directives: --{key} is set through {MANAGED[key]}, not a directive")
    if key not in ALLOWED_DIRECTIVES:
        raise JobSpecError(
            f"extra_directives: --{key} is not an sbatch option this tool accepts "
            f"(allowed: {', '.join(sorted(ALLOWED_DIRECTIVES))})"
        )
    if value is not None and not _DIRECTIVE_VALUE.fullmatch(value):
        raise JobSpecError(
            f"extra_directives: the value of --{key} must be non-empty and hold no blanks, quotes, backslashes or '#'"
        )
    return key, value


# --- one check per field, one rule per relation between fields ---------------------


def _image(value: Any) -> str:
    image = _string("image", value)
    try:
        return reference.validate(image)
    except EngineError as err:
        raise JobSpecError(f"image: {err}")


def _one_thing_to_run(spec: JobSpec) -> None:
    targets = [name for name in ("command", "python_script", "notebook") if getattr(spec, name) is not None]
    if len(targets) != 1:
        raise JobSpecError(
            f"give exactly one of command, python_script and notebook (got {', '.join(targets) or 'none'})"
        )


def _command(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    command = _words("command", value)
    if not command or not command[0]:
        raise JobSpecError("command must be a non-empty list of strings")
    return command


def _file_path(field_name: str, value: Any) -> str | None:
    path = _string(field_name, value, optional=True)
    if path is not None and not path:
        raise JobSpecError(f"{field_name} must be a path to a file")
    return path


def _time(value: Any) -> str | None:
    if value is None:
        return None
    # A whole number is minutes, as sbatch reads it.
    time = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    _string("time", time)
    try:
        seconds = duration_seconds(time)
    except ValueError:
        raise JobSpecError(f"time {time!r} is not a Slurm time limit: {TIME_HELP}")
    if seconds == 0:
        raise JobSpecError("time must be longer than zero (use UNLIMITED for no limit)")
    return time.strip()


def _modules(value: Any) -> tuple[str, ...]:
    modules = _words("modules", value)
    for module in modules:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", module):
            raise JobSpecError(f"modules: {module!r} is not a module name")
    return modules


def _variable(key: Any, value: Any) -> str:
    if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
        raise JobSpecError(f"environment: {key!r} is not a valid variable name")
    if key == "PATH":
        raise JobSpecError(
            "environment: PATH cannot be set (the job needs the PATH that finds podman-hpc; the image keeps its own)"
        )
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    return _string(f"environment[{key}]", value)


def _environment(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise JobSpecError("environment must be a mapping of variable names to strings")
    return {key: _variable(key, item) for key, item in value.items()}


def _workdir(value: Any) -> str | None:
    workdir = _string("workdir", value, optional=True)
    if workdir is not None and not os.path.isabs(workdir):
        raise JobSpecError(f"workdir must be an absolute path inside the container, not {workdir!r}")
    return workdir


def _directives(value: Any) -> tuple[str, ...]:
    directives = _words("extra_directives", value)
    for directive in directives:
        parse_directive(directive)
    return directives


def _choice(field_name: str, choices: tuple[str, ...], value: Any) -> str:
    if value not in choices:
        raise JobSpecError(f"{field_name} must be one of {', '.join(choices)}, not {value!r}")
    return value


def _mapping_of_literals(value: Any) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        raise JobSpecError("parameters must be a mapping of names to Python literals")
    return value


@dataclass(frozen=True)
class _Field:
    """One field's check: its value in, the value the spec keeps out (or JobSpecError)."""

    name: str
    check: Callable[[Any], Any]

    def __call__(self, spec: JobSpec) -> None:
        object.__setattr__(spec, self.name, self.check(getattr(spec, self.name)))  # the spec is frozen


@dataclass(frozen=True)
class _Rule:
    """A rule between fields: a spec for which ``broken`` is true is refused with ``message``."""

    message: str
    broken: Callable[[JobSpec], bool]

    def __call__(self, spec: JobSpec) -> None:
        if self.broken(spec):
            raise JobSpecError(self.message)


# JobSpec's checks, in the order a user meets their messages: the first that fails is the one reported.
_CHECKS: tuple[Callable[[JobSpec], None], ...] = (
    _Field("image", _image),
    _one_thing_to_run,
    _Field("command", _command),
    _Field("python_script", partial(_file_path, "python_script")),
    _Field("notebook", partial(_file_path, "notebook")),
    _Field("args", partial(_words, "args")),
    _Rule(
        "args go with python_script or notebook; put a command's arguments in command",
        lambda spec: bool(spec.args) and spec.command is not None,
    ),
    _Field("nodes", partial(_integer, "nodes")),
    _Field("tasks_per_node", partial(_integer, "tasks_per_node")),
    _Field("cpus_per_task", partial(_integer, "cpus_per_task", optional=True)),
    _Field("gpus_per_node", partial(_integer, "gpus_per_node", optional=True)),
    _Field("time", _time),
    _Field("partition", partial(_name, "partition", pattern=_PARTITION)),
    _Field("account", partial(_name, "account")),
    _Field("qos", partial(_name, "qos")),
    _Field("reservation", partial(_name, "reservation")),
    _Field("job_name", partial(_name, "job_name")),
    _Field("modules", _modules),
    _Field("environment", _environment),
    _Field("workdir", _workdir),
    _Field("extra_directives", _directives),
    _Field("mode", partial(_choice, "mode", MODES)),
    _Field("parameters", _mapping_of_literals),
    _Rule(
        "parameters go with a notebook (its cell tagged 'parameters')",
        lambda spec: bool(spec.parameters) and spec.notebook is None,
    ),
    _Field("parameters", check_parameters),
    _Field("notebook_magics", partial(_choice, "notebook_magics", NOTEBOOK_MAGICS)),
)


@dataclass(frozen=True)
class JobSpec:
    """A Slurm job that runs an image on ``nodes`` x ``tasks_per_node`` ranks.

    What to run is exactly one of ``command`` (argv inside the container),
    ``python_script`` or ``notebook`` (paths on this machine, copied into the
    job directory and run with the image's ``python3``); ``args`` follow a
    script or notebook. ``environment`` is exported in the batch script (so
    podman-hpc on the nodes sees it) and passed into the containers.
    ``parameters`` (name -> Python literal) are injected into a notebook after
    its cell tagged ``parameters``.
    """

    image: str
    command: tuple[str, ...] | None = None
    python_script: str | None = None
    notebook: str | None = None
    args: tuple[str, ...] = ()
    nodes: int = 1
    tasks_per_node: int = 1
    cpus_per_task: int | None = None
    gpus_per_node: int | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    reservation: str | None = None
    modules: tuple[str, ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    extra_directives: tuple[str, ...] = ()
    mode: str = "podman-exec"
    job_name: str | None = None
    notebook_magics: str = "ipython"  # IPython magics in a notebook: run under IPython, or comment them out
    parameters: Mapping[str, str] = field(default_factory=dict)  # a notebook's, as Python literals (papermill)

    def __post_init__(self) -> None:
        for check in _CHECKS:
            check(self)

    # --- derived ---------------------------------------------------------------

    @property
    def ntasks(self) -> int:
        """The job's total number of tasks (nodes times tasks per node)."""
        return self.nodes * self.tasks_per_node

    def default_job_name(self) -> str:
        """The job's name: ``job_name`` if given, else the command's, script's or notebook's file name, cut
        to characters Slurm takes, or ``podman-hpc``."""
        if self.job_name:
            return self.job_name
        if self.command is not None:
            base = PurePosixPath(self.command[0]).name
        else:
            base = PurePosixPath(self.python_script or self.notebook or "").stem
        cleaned = re.sub(r"[^A-Za-z0-9_.+@:-]", "_", base)[:64].strip("_")
        return cleaned or "podman-hpc"

    def check_modules(self, modules: ModuleSet) -> list[Module]:
        """The spec's modules as the site defines them; unknown or conflicting ones are an error."""
        try:
            chosen = modules.select(self.modules)
        except ModuleError as err:
            raise JobSpecError(f"modules: {err}")
        for module in chosen:
            if not module.cli_arg:
                raise JobSpecError(f"modules: '{module.name}' has no command-line flag and cannot be chosen for a job")
            if module.shared_run and self.mode == "per-process":
                raise JobSpecError(
                    f"modules: '{module.name}' always runs one container per node: use mode 'podman-exec'"
                )
        mpi = {SRUN_MPI[m.name] for m in chosen if m.name in SRUN_MPI}
        if len(mpi) > 1:
            raise JobSpecError("modules: choose one MPI module (openmpi-pmix or openmpi-pmi2)")
        return chosen

    # --- (de)serialising ---------------------------------------------------------

    def as_dict(self) -> dict[str, Any]:
        """The spec as JSON-ready data (lists and dicts, no tuples), as ``from_dict`` reads it."""
        data = dataclasses.asdict(self)
        for key in ("command", "args", "modules", "extra_directives"):
            if data[key] is not None:
                data[key] = list(data[key])
        data["environment"] = dict(self.environment)
        data["parameters"] = dict(self.parameters)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """A spec from JSON (a job record, a REST body); unknown keys are an error."""
        if not isinstance(data, Mapping):
            raise JobSpecError("a job specification must be a mapping of fields to values")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise JobSpecError(f"unknown job specification field '{unknown[0]}'")
        if "image" not in data:
            raise JobSpecError("image is required")
        return cls(**dict(data))

    def replace(self, **changes: Any) -> JobSpec:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)
