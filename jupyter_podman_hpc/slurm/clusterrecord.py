"""An interactive cluster's record and where its files are.

Any process of the user reads it: the one that started the cluster, its watchdog, the Jupyter
server's Containers panel. The record the host acts on (the controller and watchdog it signals,
the job it cancels) is ``.clusters/<job directory's name>.json`` in the jobs root, beside the job
directories: the engines' containers mount their job directory, never the root. A copy, ``cluster.json``
in the job directory, marks the directory as a cluster's and is what earlier versions read; the
engines (an untrusted image) may rewrite it, so nothing is done on its word: a cluster that has only
that copy (started by an earlier version) has its controller and watchdog stopped only when their
command lines are this cluster's, and its job is never cancelled from it (its engines leave when the
controller is gone). Both are 0600; ipyparallel keeps its connection files (the controller's keys)
0600 in a 0700 ``ipython/security``. In a job directory whose ranks work in ``out/`` (the only part they
may write), the host copies the engines' connection file there, reaching it through no link.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ..engine.base.files import atomic_write, read_own_json
from ..engine.errors import EngineError
from .script import OUT_DIR

RECORD = "cluster.json"
HOST_RECORDS = ".clusters"  # in the jobs root: where the host keeps the records it acts on
PROFILE = "ipython"  # the controller's profile directory, inside the job directory
CONTROLLER_LOG = "controller.log"
RECORD_LIMIT = 1 << 16  # bytes: a record is a few hundred
STATES = ("starting", "running", "ended", "stopped")
_FORMATS = {
    "cluster_id": r"[0-9a-f]{1,64}",
    "job_id": r"(\d+(_\d+)?)?",
    "owner": r"\d+:[\d.]+",
    "watchdog": r"(\d+:[\d.]+)?",
    "controller": r"(\d+:[\d.]+)?",
    "host": r"[^\s/]{1,255}",
}


class ClusterError(EngineError):
    """A cluster could not start (everything it started is stopped)."""


def host_record(directory: Path) -> Path:
    """Where the host keeps the record of the cluster whose job directory is ``directory``."""
    return directory.parent / HOST_RECORDS / f"{directory.name}.json"


@dataclass
class ClusterRecord:
    """``cluster.json``: who owns the cluster, and where its parts are."""

    cluster_id: str
    job_id: str
    engines: int  # how many engines the job starts
    owner: str  # PID:START of the process that started it (a kernel)
    host: str
    watchdog: str = ""  # PID:START of the watchdog
    controller: str = ""  # PID:START of the controller
    state: str = "starting"  # starting, running, ended (its job ended first), stopped
    created: float = 0.0

    @classmethod
    def read(cls, directory: Path) -> ClusterRecord:
        """The host's record of the cluster in ``directory``; without one (an earlier version's cluster),
        the job directory's copy with no job id. ``ClusterError`` when neither is a valid record."""
        path = host_record(directory)
        if path.exists() or path.is_symlink():
            return cls._parse(read_own_json(path, RECORD_LIMIT), path)
        record = cls._parse(read_own_json(directory / RECORD, RECORD_LIMIT), directory / RECORD)
        record.job_id = ""  # the engines could have written it
        return record

    @classmethod
    def _parse(cls, data: object, path: Path) -> ClusterRecord:
        if not isinstance(data, dict):
            raise ClusterError(f"{path} is not a cluster record (missing, a link, another's, too big or not JSON)")
        try:
            record = cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
        except TypeError as err:
            raise ClusterError(f"{path} is not a cluster record: {err}")
        wrong = record._wrong_fields()
        if wrong:
            raise ClusterError(f"{path} is not a cluster record: bad {', '.join(wrong)}")
        return record

    def _wrong_fields(self) -> list[str]:
        """The fields of a record as read that are not of their form or type."""
        wrong = [name for name, form in _FORMATS.items() if not _of_form(getattr(self, name), form)]
        if not self._counts_sound():
            wrong.append("engines, state or created")
        return wrong

    def _counts_sound(self) -> bool:
        """The engine count a number, the state a known one, the creation time a number."""
        return isinstance(self.engines, int) and self.state in STATES and isinstance(self.created, (int, float))

    def write(self, directory: Path) -> None:
        """Replace the record (0600) at once: the host's, then the copy in the job directory."""
        text = json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"
        path = host_record(directory)
        path.parent.mkdir(mode=0o700, exist_ok=True)
        atomic_write(path, text, 0o600)
        with contextlib.suppress(OSError):  # the engines' side: what they did to it changes nothing here
            atomic_write(directory / RECORD, text, 0o600)

    def update(self, directory: Path, **changes) -> None:
        """Set some fields here and on disk, keeping what another process (the watchdog) wrote there."""
        with contextlib.suppress(ClusterError):
            current = ClusterRecord.read(directory)
            for key in ("watchdog", "controller"):
                setattr(self, key, getattr(self, key) or getattr(current, key))
        for key, value in changes.items():
            setattr(self, key, value)
        self.write(directory)


def _of_form(value: object, form: str) -> bool:
    return isinstance(value, str) and re.fullmatch(form, value) is not None


def cluster_directories(root: Path) -> list[Path]:
    """The job directories under ``root`` that the host recorded a cluster for, or that hold a
    ``cluster.json`` (an earlier version's cluster), in name order."""
    hosted = {root / path.stem for path in (root / HOST_RECORDS).glob("*.json") if not path.name.startswith(".")}
    marked = {path.parent for path in root.glob(f"*/{RECORD}") if not path.parent.name.startswith(".")}
    return sorted(path for path in hosted | marked if path.is_dir())


def profile_dir(directory: Path) -> Path:
    """The controller's profile directory of the cluster in ``directory``."""
    return directory / PROFILE


def connection_files(directory: Path, cluster_id: str) -> dict[str, Path]:
    """The controller's ``client`` and ``engine`` connection files of a cluster."""
    security = profile_dir(directory) / "security"
    return {kind: security / f"ipcontroller-{cluster_id}-{kind}.json" for kind in ("client", "engine")}


def engines_dir(directory: Path) -> Path:
    """The engines' working directory, where they read their connection file (``engine_argv``): the job's
    ``out/`` when it has one, else (an earlier version's job) the job directory."""
    out = directory / OUT_DIR
    return out if out.is_dir() and not out.is_symlink() else directory


def publish_engine_file(directory: Path, cluster_id: str) -> None:
    """Copy the controller's engine connection file to the engines' working directory when that is not
    the job directory. ValueError while the controller is still writing it (not JSON yet); OSError when
    a link or another file stands in the way."""
    source = connection_files(directory, cluster_id)["engine"]
    data = source.read_bytes()
    json.loads(data)
    target = engines_dir(directory)
    if target == directory:
        return
    fd = _security_dir(target, create=True)
    try:
        atomic_write(source.name, data, 0o600, dir_fd=fd)
    finally:
        os.close(fd)


def remove_connection_files(directory: Path, cluster_id: str) -> None:
    """Remove a cluster's connection files, and the engines' copy."""
    files = connection_files(directory, cluster_id)
    for path in files.values():
        path.unlink(missing_ok=True)
    if engines_dir(directory) == directory:
        return
    with contextlib.suppress(OSError):
        fd = _security_dir(engines_dir(directory), create=False)
        try:
            os.unlink(files["engine"].name, dir_fd=fd)
        finally:
            os.close(fd)


def _security_dir(top: Path, create: bool) -> int:
    """A descriptor of ``top/ipython/security``, made 0700 when missing (``create``); no link followed
    below ``top``, which the engines write."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(top, flags)
    for part in (PROFILE, "security"):
        try:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
            child = os.open(part, flags, dir_fd=fd)
        finally:
            os.close(fd)
        fd = child
    return fd
