"""An interactive cluster's record (``cluster.json`` in its job directory) and where its files are.

Any process of the user reads it: the one that started the cluster, its watchdog, the Jupyter
server's Containers panel. The record and the controller's log are 0600; ipyparallel keeps its
connection files (the controller's keys) 0600 in a 0700 ``ipython/security``.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..engine.errors import EngineError
from ..engine.files import atomic_write

RECORD = "cluster.json"
PROFILE = "ipython"                 # the controller's profile directory, inside the job directory
CONTROLLER_LOG = "controller.log"


class ClusterError(EngineError):
    """A cluster could not start (everything it started is stopped)."""


@dataclass
class ClusterRecord:
    """``cluster.json``: who owns the cluster, and where its parts are."""

    cluster_id: str
    job_id: str
    engines: int                     # how many engines the job starts
    owner: str                       # PID:START of the process that started it (a kernel)
    host: str
    watchdog: str = ""               # PID:START of the watchdog
    controller: str = ""             # PID:START of the controller
    state: str = "starting"          # starting, running, ended (its job ended first), stopped
    created: float = 0.0

    @classmethod
    def read(cls, directory: Path) -> "ClusterRecord":
        """The record in ``directory``; ``ClusterError`` if there is none or it does not parse."""
        try:
            data = json.loads((directory / RECORD).read_text())
            return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
        except (OSError, ValueError, TypeError) as err:
            raise ClusterError(f"{directory} holds no readable cluster record: {err}")

    def write(self, directory: Path) -> None:
        """Replace the record in ``directory`` at once (0600)."""
        atomic_write(directory / RECORD, json.dumps(asdict(self), indent=2, sort_keys=True) + "\n", 0o600)

    def update(self, directory: Path, **changes) -> None:
        """Set some fields here and on disk, keeping what another process (the watchdog) wrote there."""
        with contextlib.suppress(ClusterError):
            current = ClusterRecord.read(directory)
            for key in ("watchdog", "controller"):
                setattr(self, key, getattr(self, key) or getattr(current, key))
        for key, value in changes.items():
            setattr(self, key, value)
        self.write(directory)


def connection_files(directory: Path, cluster_id: str) -> dict[str, Path]:
    """The controller's ``client`` and ``engine`` connection files of a cluster."""
    security = directory / PROFILE / "security"
    return {kind: security / f"ipcontroller-{cluster_id}-{kind}.json" for kind in ("client", "engine")}
