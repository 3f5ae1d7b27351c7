"""Interactive clusters: IPython Parallel engines as the ranks of a Slurm job, the controller here.

``Cluster.start(image, nodes=N, tasks_per_node=K, ...)`` submits an ordinary
job (the submit path's ``JobSpec``, validation and batch script) whose one
step runs ``python3 -m ipyparallel.engine`` through ``podman-hpc shared-run``
on every node, one engine per task (MPI ranks, engine id = rank, when an MPI module is given).
The controller (``ipyparallel.controller``) runs where this process runs,
its connection files in the job directory (``ipython/security``), which
every rank sees as its working directory. ``start`` returns once every
engine has registered, reporting ``Progress("cluster", current=k, total=n)``
on the way; bad input (from the spec), a missing image, engines that die
(an image without ipyparallel), a controller that fails (a scheduler that
could not listen: its log holds a traceback) or a timeout stop whatever was
started and raise ``ClusterError`` with one line. The controller listens on
a block of ports below the kernel's ephemeral range (``controller_ports``).

Nothing outlives its owner. The controller is started by a **watchdog**
(``watchdog.py``) in a session of its own, which waits on pidfds for the
owner (the kernel) and the controller. When either is gone, or on ``stop()``
(SIGTERM to the watchdog), it stops the controller's process group, cancels
the job and removes the connection files: a SIGKILLed kernel ends its job
within seconds. Should the watchdog be killed too, the engines leave by
themselves once the controller misses ``HEARTBEAT_MISSES`` heartbeats (the
job then ends), and ``sweep()`` (run by every ``start`` and by the server's
cluster listing) cancels what a dead owner left.

A cluster's record is kept by the host in the jobs root, beside its job directory, with a copy,
``cluster.json``, in the job directory (``clusterrecord.py``), so any process of the user (the Jupyter
server's Containers panel) lists and stops it. The job directory is the user's alone (0700,
``jobs.py``), but the engines, an untrusted image, write in it: the host acts on its own record only,
and signals a controller or watchdog only once it is sure the process is this cluster's
(``watchdog.runs_part``). The controller's log is read as data (bounded, never through a link).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..engine.base.files import read_untrusted_log
from ..engine.base.processes import owner_alive, owner_token
from ..engine.errors import NotFound
from ..engine.progress import Progress, ProgressCallback, ignore
from . import watchdog
from .client import SlurmClient, SlurmError
from .clusterrecord import (
    CONTROLLER_LOG,
    PROFILE,
    RECORD,
    ClusterError,
    ClusterRecord,
    cluster_directories,
    connection_files,
    profile_dir,
    publish_engine_file,
)
from .jobs import Job, JobError, default_root
from .spec import SRUN_MPI, JobSpec
from .watchdog import STOP_GRACE, runs_part, stop_parts, wait_gone

if TYPE_CHECKING:
    import ipyparallel

HEARTBEAT_MISSES = 10  # x 3 s heartbeat period: engines leave 30 s after the controller
DEFAULT_TIME = "60"  # minutes, when the caller gives no time limit
CONTROLLER_START = 30.0  # seconds for the controller to write its connection files
CONTROLLER_PORTS = 32  # ipyparallel 9 listens on 18 (2 broadcast leaves); the rest is headroom
PORTS_FLOOR = 10000  # the controller's ports are chosen above this, below the ephemeral range
LOG_READ = 1 << 16  # bytes of the controller's log read for its last words


class ClusterNotFound(ClusterError, NotFound):
    """No job directory records that cluster."""


def engine_argv(cluster_id: str, mpi: bool = False) -> tuple[str, ...]:
    """What every rank runs: an engine reading the connection file from its working directory (the job's
    ``out/``, or the job directory of an earlier version's layout: ``engines_dir``)."""
    argv = [
        "python3",
        "-m",
        "ipyparallel.engine",
        f"--file={PROFILE}/security/ipcontroller-{cluster_id}-engine.json",
        "--IPEngine.wait_for_url_file=120",  # the controller starts once the job is submitted
        f"--IPEngine.max_heartbeat_misses={HEARTBEAT_MISSES}",
        "--log-level=WARN",
    ]
    if mpi:
        argv.append("--mpi")  # engine id = MPI rank
    return tuple(argv)


def cluster_spec(cluster_id: str, image: str, **fields) -> JobSpec:
    """The engines' job: ``JobSpec`` fields (resources, modules, environment...) with the engine command.

    Validated as any job; what to run, the mode and the working directory are the cluster's.
    """
    taken = sorted({"command", "python_script", "notebook", "args", "mode", "workdir"} & set(fields))
    if taken:
        raise ClusterError(f"a cluster sets {taken[0]} itself")
    modules = fields.get("modules") or ()
    mpi = not isinstance(modules, str) and any(module in SRUN_MPI for module in modules)
    fields["time"] = fields.get("time") or DEFAULT_TIME
    fields["job_name"] = fields.get("job_name") or f"ipengines-{cluster_id}"
    try:
        return JobSpec(image=image, command=engine_argv(cluster_id, mpi), mode="podman-exec", **fields)
    except TypeError as err:  # a field JobSpec does not have
        raise ClusterError(f"not a job specification field: {err}")


def controller_argv(directory: Path, cluster_id: str, ip: str, ports: range) -> list[str]:
    """The command line of a cluster's ipyparallel controller: its profile in the job directory, the cluster
    id, the address the engines reach it at, the ports it listens on."""
    return [
        sys.executable,
        "-m",
        "ipyparallel.controller",
        f"--profile-dir={profile_dir(directory.absolute())}",
        f"--cluster-id={cluster_id}",
        f"--ip={ip}",
        f"--IPController.ports={ports[0]}-{ports[-1]}",
        "--log-level=WARN",
    ]


def controller_ports(count: int = CONTROLLER_PORTS) -> range:
    """A block of ``count`` free ports below the kernel's ephemeral range, for the controller.

    ipyparallel's own choice is a port the kernel just gave it for ``bind(0)``, closed again until
    a scheduler process binds it; in between, any outgoing connection (an engine registering) may get
    it as its source port, and that scheduler dies with "Address already in use". Ports below the
    ephemeral range are never handed out that way.
    """
    first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    low, high = (PORTS_FLOOR, first_ephemeral) if first_ephemeral - PORTS_FLOOR > 16 * count else (1024, 65536)
    for _ in range(64):
        start = random.randrange(low, high - count)
        block = range(start, start + count)
        if all(_free(port) for port in block):
            return block
    raise ClusterError(f"no {count} free ports for the IPython Parallel controller between {low} and {high}")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


# --- the cluster --------------------------------------------------------------------


class Cluster:
    """A running cluster: its job, record and (in the process that started it) its watchdog."""

    def __init__(self, job: Job, record: ClusterRecord, watchdog: subprocess.Popen | None = None):
        self.job = job
        self.record = record
        self._watchdog = watchdog
        self._clients: list = []

    def __repr__(self) -> str:
        return f"<Cluster {self.id}: job {self.job_id}, {self.record.engines} engines, {self.record.state}>"

    @property
    def id(self) -> str:
        """The cluster id ipyparallel knows it by (its connection files carry it)."""
        return self.record.cluster_id

    @property
    def job_id(self) -> str:
        """The Slurm job id of the cluster's engines (the host's record's; else the job record's, for an
        earlier version's cluster)."""
        return self.record.job_id or self.job.id

    @property
    def directory(self) -> Path:
        """The cluster's job directory: its record, profile, logs and connection files."""
        return self.job.directory

    @property
    def connection_files(self) -> dict[str, Path]:
        """The controller's ``client`` and ``engine`` connection files, present once it has started."""
        return connection_files(self.directory, self.id)

    # --- starting ---------------------------------------------------------------

    @classmethod
    def start(
        cls,
        image: str,
        *,
        controller_ip: str = "127.0.0.1",
        timeout: float = 600,
        root: str | Path | None = None,
        client: SlurmClient | None = None,
        config=None,
        progress: ProgressCallback = ignore,
        **fields,
    ) -> Cluster:
        """Submit the engines' job, start the controller and wait until every engine has registered.

        ``fields`` are those of a ``JobSpec`` (nodes, tasks_per_node, time, partition, modules,
        environment...), validated as for a submission, before anything starts.
        """
        client = client or SlurmClient()
        cluster_id = secrets.token_hex(4)
        engines_spec = cluster_spec(cluster_id, image, **fields)
        sweep(root, client=client)
        progress(Progress("cluster", f"submitting {engines_spec.ntasks} engines", current=0, total=engines_spec.ntasks))
        job = Job.submit(engines_spec, root, client=client, config=config)  # validates; nothing before
        record = ClusterRecord(
            cluster_id, job.id, engines_spec.ntasks, owner_token(), socket.gethostname(), created=time.time()
        )
        cluster = cls(job, record)
        try:
            record.write(job.directory)
            cluster._start_controller(controller_ip, client)
            cluster._wait_for_engines(timeout, progress)
        except BaseException:
            cluster.stop()
            raise
        record.update(job.directory, state="running")
        _STARTED.append(cluster)
        return cluster

    def _start_controller(self, ip: str, client: SlurmClient) -> None:
        self._watchdog = watchdog.start(
            self.record.owner,
            self.directory,
            controller_argv(self.directory, self.id, ip, controller_ports()),
            client.env or os.environ,
        )
        self.record.watchdog = owner_token(self._watchdog.pid)
        deadline = time.monotonic() + CONTROLLER_START
        while not self._connection_files_ready():
            if self._watchdog.poll() is not None or time.monotonic() > deadline:
                log = _raised(self.directory / CONTROLLER_LOG) or _tail(self.directory / CONTROLLER_LOG)
                raise ClusterError(f"the IPython Parallel controller did not start{': ' + log if log else ''}")
            time.sleep(0.05)

    def _connection_files_ready(self) -> bool:
        """The controller has written both connection files whole, and the engines' is where they read it."""
        if not all(path.exists() for path in self.connection_files.values()):
            return False
        try:
            publish_engine_file(self.directory, self.id)
        except ValueError:  # still being written
            return False
        except OSError as err:
            raise ClusterError(f"the engines' connection file could not be put in their working directory: {err}")
        return True

    def _wait_for_engines(self, timeout: float, progress: ProgressCallback) -> None:
        ipp_client = self.client()
        try:
            self._count_engines(ipp_client, timeout, progress)
        finally:
            ipp_client.close()
            self._clients.remove(ipp_client)

    def _count_engines(self, ipp_client, timeout: float, progress: ProgressCallback) -> None:
        total = self.record.engines
        deadline = time.monotonic() + timeout
        seen, next_status, state = None, 0.0, ""
        while True:
            registered = len(ipp_client.ids)
            now = time.monotonic()
            if now >= next_status or registered == total:
                state = self._job_state(registered, total)
                next_status = now + 1.0
            seen = self._report_engines(registered, total, state, seen, progress)
            if registered >= total:
                return
            self._check_still_starting(registered, total, state, now > deadline, timeout)
            time.sleep(0.1)

    def _job_state(self, registered: int, total: int) -> str:
        """The job's state; ClusterError when it ended before every engine registered, or when the
        controller's log says a scheduler process died (the controller serves on, without it)."""
        status = self.job.status()
        if status.finished and registered < total:
            raise ClusterError(self._engines_failed(status.describe()))
        raised = _raised(self.directory / CONTROLLER_LOG)
        if raised:
            raise ClusterError(f"the IPython Parallel controller failed ({raised}); the cluster was stopped")
        return status.state

    def _report_engines(
        self, registered: int, total: int, state: str, seen: tuple | None, progress: ProgressCallback
    ) -> tuple:
        """A Progress event when a new engine registered or the job's state changed since ``seen``."""
        if (registered, state) != seen:
            progress(
                Progress(
                    "cluster",
                    f"{registered}/{total} engines registered (job {self.job_id} {state})",
                    current=registered,
                    total=total,
                    item=self.job_id,
                )
            )
        return (registered, state)

    def _check_still_starting(self, registered: int, total: int, state: str, late: bool, timeout: float) -> None:
        """ClusterError when the engines are ``late`` or the controller exited."""
        if late:
            raise ClusterError(
                f"only {registered} of {total} engines registered within {timeout:g} s "
                f"(job {self.job_id} {state}): the cluster was stopped"
            )
        if self._watchdog is not None and self._watchdog.poll() is not None:
            raise ClusterError(
                "the IPython Parallel controller exited: " + (_tail(self.directory / CONTROLLER_LOG) or "see its log")
            )

    def _engines_failed(self, described: str) -> str:
        """One line on why the job ended before every engine registered: the first rank's last words."""
        said = _last_words(self.job.logs("err"))
        missing = [line for _, lines in said for line in lines if "No module named" in line]
        if missing:
            return (
                f"the engines could not start in {self.job.spec.image} ({missing[0]}): the image needs "
                "ipyparallel (and mpi4py for an MPI module); the cluster was stopped"
            )
        why = f"rank {said[0][0]}: {said[0][1][-1]}" if said else self._batch_last_line()
        return f"the engines' {described} before they all registered ({why}); the cluster was stopped"

    def _batch_last_line(self) -> str:
        batch = [line.strip() for line in self.job.batch_log().splitlines() if line.strip()]
        return batch[-1] if batch else "no output"

    # --- using ------------------------------------------------------------------

    def client(self, **kwargs) -> ipyparallel.Client:
        """An ``ipyparallel.Client`` connected to this cluster's controller."""
        import ipyparallel

        kwargs.setdefault("timeout", 30)
        found = ipyparallel.Client(str(self.connection_files["client"]), **kwargs)
        self._clients.append(found)
        return found

    def engine_ids(self, timeout: float = 5) -> list[int]:
        """The ids of the engines registered now ([] if the controller does not answer)."""
        if not self.connection_files["client"].exists():
            return []
        try:
            import ipyparallel

            connected = ipyparallel.Client(str(self.connection_files["client"]), timeout=timeout)
        except Exception:  # noqa: BLE001  zmq's, a timeout, a half-written connection file: no engines to count
            return []
        try:
            return list(connected.ids)
        finally:
            connected.close()

    # --- stopping ---------------------------------------------------------------

    def stop(self, timeout: float = 60) -> None:
        """Stop the engines (cancel the job) and the controller; remove its connection files."""
        for connected in self._clients:
            with contextlib.suppress(Exception):
                connected.close()
        self._clients.clear()
        if self._watchdog is not None:
            with contextlib.suppress(ProcessLookupError):
                self._watchdog.terminate()
            try:
                self._watchdog.wait(STOP_GRACE * 3)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
                self._watchdog.wait()
        elif runs_part(self.record.watchdog, self.directory, "watchdog"):
            _signal(self.record.watchdog, signal.SIGTERM)
            wait_gone(self.record.watchdog, STOP_GRACE * 3)
        # What the watchdog does, done again: it may have died before it could.
        with contextlib.suppress(ClusterError):
            self.record.controller = ClusterRecord.read(self.directory).controller or self.record.controller
        stop_parts(self.directory, self.record, self.job.client)
        deadline = time.monotonic() + timeout  # until the nodes are clean (the job no longer completing)
        while self.record.job_id and time.monotonic() < deadline:
            try:
                if not self.job.client.in_queue(self.record.job_id):
                    break
            except SlurmError:
                break
            time.sleep(0.2)
        with contextlib.suppress(OSError):
            self.record.update(self.directory, state="stopped")

    def as_dict(self) -> dict:
        """The cluster as the REST API and the UI see it (asks Slurm and the controller)."""
        try:
            status = self.job.status()
        except (SlurmError, JobError):
            status = None
        return {
            "id": self.id,
            "job_id": self.job_id,
            "image": self.job.record.spec.get("image"),
            "nodes": self.job.record.spec.get("nodes"),
            "engines": self.record.engines,
            "registered": len(self.engine_ids()),
            "state": self.record.state,
            "host": self.record.host,
            "directory": str(self.directory),
            "job_state": status.state if status else None,
            "nodelist": status.nodelist if status else "",
        }


def _last_words(logs: Mapping[int, str]) -> list[tuple[int, list[str]]]:
    """(rank, its lines) of each rank that said something besides noise, in rank order."""
    said = []
    for rank, text in logs.items():
        lines = [line.strip() for line in text.splitlines() if line.strip() and not _noise(line)]
        if lines:
            said.append((rank, lines))
    return said


def _noise(line: str) -> bool:
    """Lines every engine writes (the debugger's frozen-modules note, ZMQ security), not reasons."""
    return (
        "Debugger warning" in line
        or "frozen" in line
        or "PYDEVD" in line
        or "CurveZMQ" in line
        or line.startswith("0.0")
    )


def _signal(token: str, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
        os.kill(int(token.partition(":")[0]), sig)


def _raised(log: Path) -> str:
    """The exception of the first traceback in a log ("ZMQError: Address already in use ..."), or ""."""
    in_traceback = False
    lines = _read_log(log).splitlines()
    for line in lines:
        if line.startswith("Traceback (most recent call last)"):
            in_traceback = True
        elif in_traceback and line.strip() and not line[0].isspace():
            return line.strip()
    return ""


def _tail(path: Path, lines: int = 1) -> str:
    text = [line.strip() for line in _read_log(path).splitlines() if line.strip()]
    return " / ".join(text[-lines:])


def _read_log(path: Path) -> str:
    """The controller's log (its last ``LOG_READ`` bytes), in a directory the engines write: as data."""
    try:
        return read_untrusted_log(path, LOG_READ, beneath=path.parent)
    except OSError:
        return ""


# --- finding clusters again ---------------------------------------------------------

_STARTED: list[Cluster] = []  # the clusters this process started


def started_here() -> list[Cluster]:
    """The running clusters this process started, oldest first (stopped elsewhere too: the record says)."""
    for cluster in _STARTED:
        with contextlib.suppress(ClusterError):
            cluster.record.state = ClusterRecord.read(cluster.directory).state
    return [cluster for cluster in _STARTED if cluster.record.state != "stopped"]


@atexit.register
def _stop_started() -> None:
    """A process that exits normally (a kernel shut down) stops its clusters itself."""
    for cluster in started_here():
        with contextlib.suppress(Exception):
            cluster.stop(timeout=10)


def list_clusters(
    root: str | Path | None = None, *, client: SlurmClient | None = None, running: bool = True
) -> list[Cluster]:
    """The clusters recorded in job directories (``running``: only those not stopped), oldest first."""
    client = client or SlurmClient()
    root = Path(root) if root is not None else default_root(client.env)
    found = []
    for directory in cluster_directories(root):
        try:
            record = ClusterRecord.read(directory)
            job = Job(directory, client=client)
        except (ClusterError, JobError):
            continue
        if not job.id or (running and record.state == "stopped"):
            continue
        found.append(Cluster(job, record))
    return found


def find_cluster(cluster_id: str, root: str | Path | None = None, *, client: SlurmClient | None = None) -> Cluster:
    """The recorded cluster, running or stopped, whose cluster id or job id is ``cluster_id``;
    ClusterNotFound otherwise."""
    for cluster in list_clusters(root, client=client, running=False):
        if cluster.id == cluster_id or cluster.job_id == cluster_id:
            return cluster
    raise ClusterNotFound(f"no cluster {cluster_id!r}")


def sweep(root: str | Path | None = None, *, client: SlurmClient | None = None) -> list[str]:
    """Stop the clusters of this host whose owner is dead (what a killed watchdog left); their ids."""
    host = socket.gethostname()
    swept = []
    try:
        clusters = list_clusters(root, client=client)
    except JobError:
        return []
    for cluster in clusters:
        record = cluster.record
        if (
            record.host != host
            or owner_alive(record.owner)
            or runs_part(record.watchdog, cluster.directory, "watchdog")
        ):
            continue
        stop_parts(cluster.directory, record, cluster.job.client)
        with contextlib.suppress(OSError):
            record.update(cluster.directory, state="stopped")
        swept.append(record.cluster_id)
    return swept


__all__ = [
    "CONTROLLER_LOG",
    "PROFILE",
    "RECORD",
    "Cluster",
    "ClusterError",
    "ClusterNotFound",
    "ClusterRecord",
    "cluster_spec",
    "connection_files",
    "engine_argv",
    "find_cluster",
    "list_clusters",
    "sweep",
]
