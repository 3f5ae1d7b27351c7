"""Jobs: a job directory on the shared scratch per submission, found again from disk and Slurm.

A job directory (``$SCRATCH/podman-hpc/jobs/<id>/`` by default, ``<id>`` a
UTC time stamp and a random suffix) holds the batch script ``job.sh``, the
job's inputs (a copied Python script, a notebook and the script converted
from it), the record ``job.json`` (spec, Slurm job id, submit time, run
target, and the final status once known), Slurm's own log
``slurm-<jobid>.out`` and one ``rank-<N>.out``/``.err`` pair per rank, and
``out/``: the one directory the ranks may write (the rest they see
read-only; the record's ``run["out"]`` names it, absent in the directories of
older versions, whose ranks wrote everywhere). The logs and everything in
``out/`` are read as data (``files.read_untrusted``): bounded, never through
a link, never blocking on a FIFO.

Nothing half-written: the directory is assembled under a hidden temporary
name and renamed into place complete; then sbatch runs; a failed sbatch
removes the directory (so every directory with a record was submitted), and
the Slurm job id is added to the record by an atomic rewrite. A crash
between sbatch and that rewrite leaves a record without a job id: the job id
is then recovered from ``slurm-<jobid>.out`` once the job has started.
Jobs are found again by reading the directories' records and asking Slurm,
so a restarted Jupyter server sees every job it submitted.

Only the user reads a job: the record and the script hold the job's
environment (tokens, often), so job directories (and the jobs root when we
make it) are 0700, and ``job.json`` and ``job.sh`` 0600 and 0700, whatever
the umask (each written under a new O_EXCL name and renamed into place). A
directory an older version left 0755 keeps working; its record becomes 0600
at its next rewrite.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..engine.base.files import UntrustedFile, atomic_write, read_untrusted, read_untrusted_log
from ..engine.errors import EngineError, ImageNotFound, NotFound
from ..engine.images.catalog import find_squashed
from ..engine.progress import Progress, ProgressCallback, ignore
from ..engine.site.config import SiteConfig, load_config
from ..engine.site.modules import ModuleSet
from . import notebook as notebooks
from .client import JobStatus, SlurmClient, SlurmError
from .nbrecorder import is_plain_name
from .script import OUT_DIR, PYTHON, RunTarget, render
from .spec import JobSpec, JobSpecError

RECORD = "job.json"
SCRIPT = "job.sh"
RESERVED = {RECORD, SCRIPT}
JOBS_SUBDIR = Path("podman-hpc") / "jobs"
RECORD_VERSION = 1
_STALE_STAGING = 24 * 3600  # seconds after which an abandoned temporary job directory is removed
DIR_MODE, RECORD_MODE, SCRIPT_MODE = 0o700, 0o600, 0o700  # the user's alone: they hold the job's secrets
LOG_LIMIT = 1 << 20  # bytes of each log read back (its end): what a person reads, never the server's memory
RECORD_LIMIT = 4 << 20  # a job.json is a few kB; one of an older job directory, its ranks could have written


class JobError(EngineError):
    """A job cannot be created, found or read."""


class JobNotFound(JobError, NotFound):
    """No job directory records that job."""


class JobTimeout(JobError):
    """``Job.wait`` gave up; ``status`` is the last status seen."""

    def __init__(self, message: str, status: JobStatus):
        super().__init__(message, 124)
        self.status = status


def job_directories(root: Path, record: str = RECORD) -> list[Path]:
    """The job directories under ``root`` that hold a ``record`` file, in name order
    (hidden ones, a job's directory being written, are not jobs yet)."""
    if not root.is_dir():
        return []
    return [
        directory
        for directory in sorted(root.glob("*"))
        if not directory.name.startswith(".") and (directory / record).is_file()
    ]


def default_root(environ: Mapping[str, str] | None = None) -> Path:
    """``$SCRATCH/podman-hpc/jobs``: job directories live where every node sees them."""
    env = os.environ if environ is None else environ
    scratch = env.get("SCRATCH")
    if not scratch:
        raise JobError("SCRATCH is not set: set it to a directory every node sees, or give the jobs root")
    return Path(scratch) / JOBS_SUBDIR


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


def _new_id() -> str:
    return f"{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def _atomic_write(path: Path, text: str, mode: int = RECORD_MODE) -> None:
    atomic_write(path, text, mode)


def make_root(root: Path) -> None:
    """The jobs root and its missing parents, made 0700 (existing ones are left as they are)."""
    missing = [parent for parent in (root, *root.parents) if not parent.exists()]
    for directory in reversed(missing):
        try:
            directory.mkdir(DIR_MODE)
        except FileExistsError:
            pass  # made meanwhile (another submission)


@dataclass
class JobRecord:
    """``job.json``: what was submitted, when, and (once known) how it ended."""

    id: str  # the job directory's name
    spec: dict
    submitted: str  # ISO 8601, UTC
    job_id: str | None = None  # Slurm's, once sbatch answered
    script: str = SCRIPT
    run: dict = field(default_factory=dict)  # kind, argv (inside the container), inputs, notes
    final: dict | None = None  # the finished JobStatus, cached
    version: int = RECORD_VERSION

    def as_json(self) -> str:
        """The record as the ``job.json`` file holds it (indented, keys sorted)."""
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def read(cls, path: Path) -> JobRecord:
        """The record in ``path``; JobNotFound when there is none, JobError naming the file when it cannot
        be read or is not a record (truncated, edited)."""
        data = _record_data(path)
        for broken, what in _RECORD_CHECKS:
            if broken(data):
                raise JobError(f"job record {path} {what}: its job is not listed")
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def _record_data(path: Path) -> Any:
    """The JSON value of a job record, read as data; JobNotFound or JobError when it cannot be."""
    try:
        return json.loads(read_untrusted(path, RECORD_LIMIT))
    except FileNotFoundError:
        raise JobNotFound(f"{path.parent} is not a job directory (no {RECORD})")
    except UntrustedFile as err:
        raise JobError(f"cannot read the job record {path}: {err}: its job is not listed")
    except OSError as err:
        raise JobError(f"cannot read the job record {path}: {err.strerror or err}")
    except ValueError as err:
        where = f" (line {err.lineno}, column {err.colno})" if isinstance(err, json.JSONDecodeError) else ""
        raise JobError(
            f"job record {path} is not valid JSON{where}, truncated or edited: "
            f"its job is not listed (the batch script and logs beside it are kept)"
        )


# What makes a job record's data not a record, checked in this order: (broken, what the message says).
_RECORD_CHECKS: tuple[tuple[Callable[[Any], bool], str], ...] = (
    (
        lambda data: not isinstance(data, dict) or not {"id", "spec", "submitted"} <= set(data),
        "lacks its id, spec or submit time",
    ),
    (
        lambda data: not isinstance(data["spec"], dict) or not isinstance(data.get("run") or {}, dict),
        "has a malformed spec or run",
    ),
    (
        lambda data: not is_plain_name(data.get("script", SCRIPT)),
        "names a script that is not a file of its directory",
    ),
)


# --- submitting, step by step ------------------------------------------------------------


def _site_for(spec: JobSpec, client: SlurmClient, config: SiteConfig | None) -> tuple[SiteConfig, ModuleSet]:
    """The site's config and modules for ``spec``; its modules and its image checked to be there."""
    # The nodes see the submitter's environment and, over it, the one the script exports.
    config = config or load_config({**(client.env or os.environ), **spec.environment})
    modules = ModuleSet.load(config.modules_dir)
    spec.check_modules(modules)
    if find_squashed(config, spec.image) is None:
        raise ImageNotFound(
            f"image {spec.image} is not in the squashed store {config.squash_dir}, where the "
            "nodes run it from: squash it first (podman-hpc migrate, or pull)"
        )
    return config, modules


def _made_root(root: str | Path | None, client: SlurmClient) -> Path:
    """The jobs directory, made if missing."""
    root = Path(root) if root is not None else default_root(client.env)
    try:
        make_root(root)
    except OSError as err:
        raise JobError(f"cannot create the jobs directory {root}: {err.strerror}")
    return root


def _write_directory(
    spec: JobSpec, root: Path, modules: ModuleSet, config: SiteConfig, progress: ProgressCallback
) -> tuple[Path, JobRecord]:
    """A new job directory under ``root``, written in a staging directory renamed at once; nothing left
    behind when it fails."""
    name = _new_id()
    directory = root / name
    staging = root / f".{name}.tmp"
    try:
        record = _stage(spec, staging, directory, modules, config, progress)
        os.rename(staging, directory)
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise JobError(f"cannot write the job directory {directory}: {err.strerror or err}")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory, record


def _stage(
    spec: JobSpec, staging: Path, directory: Path, modules: ModuleSet, config: SiteConfig, progress: ProgressCallback
) -> JobRecord:
    """The job's inputs, batch script and record, in ``staging`` (to become ``directory``)."""
    staging.mkdir(DIR_MODE)
    os.chmod(staging, DIR_MODE)  # whatever the umask: the record holds the job's secrets
    (staging / OUT_DIR).mkdir(DIR_MODE)
    os.chmod(staging / OUT_DIR, DIR_MODE)
    target, run = _prepare_inputs(spec, staging, directory)
    run["out"] = OUT_DIR
    for note in run.get("warnings", []):
        progress(Progress("job", note))
    script = render(spec, directory, target=target, modules=modules, config=config)
    _atomic_write(staging / SCRIPT, script, SCRIPT_MODE)
    record = JobRecord(id=directory.name, spec=spec.as_dict(), submitted=_now(), run=run)
    _atomic_write(staging / RECORD, record.as_json())
    return record


def _submit_directory(client: SlurmClient, directory: Path, record: JobRecord) -> None:
    """sbatch the job directory's script, then record the job id; the directory removed (and the job
    cancelled) when either fails."""
    try:
        record.job_id = client.submit(directory / SCRIPT, cwd=str(directory))
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)  # sbatch refused it: no job, no directory
        raise
    try:
        _atomic_write(directory / RECORD, record.as_json())
    except OSError as err:
        try:
            client.cancel(record.job_id)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        raise JobError(f"job {record.job_id} was cancelled: its record could not be written ({err.strerror or err})")


def _live_statuses(client: SlurmClient, live: list[str]) -> dict[str, JobStatus]:
    """Slurm's statuses of the unfinished jobs ``live``; none when Slurm cannot be reached."""
    try:
        return client.statuses(live) if live else {}
    except SlurmError:
        return {}  # Slurm unreachable: the jobs are still listed, without a live status


def _pause(delay: float, deadline: float | None) -> float:
    """The next poll's pause: ``delay``, cut short at the deadline."""
    return delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic()))


class Job:
    """A submitted job: its directory, its record and Slurm's view of it."""

    def __init__(self, directory: str | Path, record: JobRecord | None = None, client: SlurmClient | None = None):
        self.directory = Path(directory)
        self.record = record or JobRecord.read(self.directory / RECORD)
        self.client = client or SlurmClient()
        self._status: JobStatus | None = None

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.directory}>"

    # --- identity -------------------------------------------------------------------

    @property
    def id(self) -> str:
        """Slurm's job id ("" if the submission never got one)."""
        return self.record.job_id or ""

    @property
    def spec(self) -> JobSpec:
        """The job's specification, as submitted (from its record)."""
        return JobSpec.from_dict(self.record.spec)

    @property
    def script_path(self) -> Path:
        """The batch script sbatch was given, in the job directory."""
        return self.directory / self.record.script

    @property
    def script(self) -> str:
        """The batch script exactly as submitted (read as data: in a job directory of an older version
        the ranks could write it)."""
        return read_untrusted(self.script_path, RECORD_LIMIT).decode(errors="replace")

    @property
    def submitted(self) -> str:
        """When the job was submitted (ISO 8601, from its record)."""
        return self.record.submitted

    # --- creating -------------------------------------------------------------------

    @classmethod
    def submit(
        cls,
        spec: JobSpec,
        root: str | Path | None = None,
        *,
        client: SlurmClient | None = None,
        config: SiteConfig | None = None,
        progress: ProgressCallback = ignore,
    ) -> Job:
        """Write the job directory, submit it with sbatch, and return the job."""
        client = client or SlurmClient()
        config, modules = _site_for(spec, client, config)
        root = _made_root(root, client)
        _remove_stale_staging(root)
        directory, record = _write_directory(spec, root, modules, config, progress)
        progress(Progress("job", f"submitting {directory / SCRIPT}"))
        _submit_directory(client, directory, record)
        job = cls(directory, record, client)
        progress(Progress("job", f"submitted job {job.id}", item=job.id))
        return job

    @classmethod
    def preview(
        cls,
        spec: JobSpec,
        root: str | Path | None = None,
        *,
        config: SiteConfig | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> str:
        """The batch script ``submit`` would write (the job directory's name aside)."""
        config = config or load_config(environ)
        modules = ModuleSet.load(config.modules_dir)
        root = Path(root) if root is not None else default_root(environ)
        directory = root / _new_id()
        with tempfile.TemporaryDirectory() as scratch:
            target, _ = _prepare_inputs(spec, Path(scratch), directory)
            return render(spec, directory, target=target, modules=modules, config=config)

    # --- finding again ------------------------------------------------------------------

    @classmethod
    def list(
        cls,
        root: str | Path | None = None,
        *,
        client: SlurmClient | None = None,
        status: bool = True,
        problems: list[str] | None = None,
    ) -> list[Job]:
        """Every job recorded under ``root``, oldest first.

        With ``status``, Slurm is asked about all unfinished jobs at once (one
        squeue, one sacct); if Slurm cannot be reached the jobs are listed
        without a status (``status(refresh=False)`` then asks again). A record
        that cannot be read (truncated, edited) does not stop the listing: its
        job is left out and one line naming the record goes to ``problems``.
        """
        client = client or SlurmClient()
        root = Path(root) if root is not None else default_root(client.env)
        jobs = [job for job in cls._readable(root, client, problems) if job._recover_job_id()]
        jobs.sort(key=lambda j: (j.submitted, j.directory.name))
        if status:
            found = _live_statuses(client, [j.id for j in jobs if not j.record.final])
            for job in jobs:
                job._take_status(found)
        return jobs

    @classmethod
    def _readable(cls, root: Path, client: SlurmClient, problems: list[str] | None) -> Iterator[Job]:
        """The jobs under ``root`` whose records can be read; a line in ``problems`` for each other."""
        for directory in job_directories(root):
            try:
                job = cls(directory, client=client)
            except JobError as err:
                if problems is not None:
                    problems.append(str(err))
                continue
            yield job

    def _take_status(self, found: Mapping[str, JobStatus]) -> None:
        """The status ``list`` found: the record's once finished, else Slurm's (remembered if final)."""
        if self.record.final:
            self._status = JobStatus.from_dict({**self.record.final, "source": "record"})
            return
        self._status = found.get(self.id)
        if self._status is not None:
            self._remember(self._status)

    @classmethod
    def find(cls, job_id: str | int, root: str | Path | None = None, *, client: SlurmClient | None = None) -> Job:
        """The job with Slurm id ``job_id`` (the latest, should Slurm have reused it)."""
        client = client or SlurmClient()
        root_path = Path(root) if root is not None else default_root(client.env)
        matches = [job for job in cls.list(root_path, client=client, status=False) if job.id == str(job_id)]
        if not matches:
            raise JobNotFound(f"no job {job_id} in {root_path}")
        return matches[-1]

    def _recover_job_id(self) -> bool:
        """Whether the job has a Slurm id, recovering it from ``slurm-<id>.out`` if the record lacks it."""
        if self.record.job_id:
            return True
        logs = sorted(self.directory.glob("slurm-*.out"))
        found = [m.group(1) for p in logs if (m := re.fullmatch(r"slurm-(\d+)\.out", p.name))]
        if len(found) != 1:
            return False
        self.record.job_id = found[0]
        self._update_record(job_id=found[0])
        return True

    def _update_record(self, **changes) -> None:
        """Rewrite some fields of ``job.json`` (re-read first: another process may have written it)."""
        try:
            current = JobRecord.read(self.directory / RECORD)
        except JobError:
            current = self.record
        for key, value in changes.items():
            setattr(current, key, value)
            setattr(self.record, key, value)
        try:
            _atomic_write(self.directory / RECORD, current.as_json())
        except OSError:
            pass  # the record stays as it was; Slurm still knows the rest

    # --- Slurm ------------------------------------------------------------------------

    def status(self, refresh: bool = True) -> JobStatus:
        """The job's status: from the record once it has finished, else from Slurm."""
        if self.record.final:
            return JobStatus.from_dict({**self.record.final, "source": "record"})
        if self._status is not None and not refresh:
            return self._status
        if not self.id:
            raise JobError(f"{self.directory} has no Slurm job id: it was never submitted")
        status = self.client.status(self.id)
        self._status = status
        self._remember(status)
        return status

    def _remember(self, status: JobStatus) -> None:
        """Record a finished job's end, after which the record answers instead of Slurm.

        Not while only squeue knows the end without its exit code: that would fix a half-known end forever.
        """
        if status.finished and (status.exit_code is not None or status.source == "sacct"):
            self._update_record(final=status.as_dict())

    def wait(
        self, timeout: float | None = None, poll_interval: float = 1.0, progress: ProgressCallback = ignore
    ) -> JobStatus:
        """Until the job has finished; JobTimeout after ``timeout`` seconds.

        Polls squeue (then sacct) starting at 0.1 s and backing off to
        ``poll_interval``; reports each change of state as a Progress event
        with ``stage="job"``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = min(0.1, poll_interval)
        last: tuple = ()
        failures = 0
        while True:
            status, failures = self._poll(failures)
            if status is not None:
                last = self._report(status, last, progress)
                if status.finished:
                    return status
            if deadline is not None and time.monotonic() >= deadline:
                current = status or self._status or JobStatus(self.id, "UNKNOWN")
                raise JobTimeout(f"job {self.id} is still {current.state} after {timeout:g} s", current)
            time.sleep(_pause(delay, deadline))
            delay = min(delay * 2, poll_interval)

    def _poll(self, failures: int) -> tuple[JobStatus | None, int]:
        """The status and the count of Slurm's failures in a row; the fifth failure is raised."""
        try:
            return self.status(), 0
        except SlurmError:
            failures += 1  # a busy slurmctld: try again a few times
            if failures >= 5:
                raise
            return None, failures

    def _report(self, status: JobStatus, last: tuple, progress: ProgressCallback) -> tuple:
        """A Progress event when the state, reason or nodes changed since ``last``; what was seen."""
        seen = (status.state, status.reason, status.nodelist)
        if seen != last:
            progress(Progress("job", status.describe(), item=self.id, current=1 if status.finished else 0, total=1))
        return seen

    def cancel(self) -> None:
        """``scancel`` the job (a job that already ended is left as it is)."""
        if not self.id:
            raise JobError(f"{self.directory} has no Slurm job id: there is nothing to cancel")
        if self.record.final:
            return
        try:
            self.client.cancel(self.id)
        except SlurmError:
            if not self.status().finished:  # one Slurm has forgotten, because it ended long ago
                raise

    # --- output ------------------------------------------------------------------------

    def logs(self, stream: str = "out") -> dict[int, str]:
        """Each rank's output (``stream`` "out" or "err"), by rank: its last ``LOG_LIMIT`` bytes, or one
        line saying why it is not read (a link, a FIFO: ``files.read_untrusted_log``)."""
        if stream not in ("out", "err"):
            raise JobError(f"stream must be 'out' or 'err', not {stream!r}")
        found: dict[int, str] = {}
        for path in self.directory.glob(f"rank-*.{stream}"):
            match = re.fullmatch(rf"rank-(\d+)\.{stream}", path.name)
            if match:
                found[int(match.group(1))] = read_untrusted_log(path, LOG_LIMIT)
        return dict(sorted(found.items()))

    def labelled_output(self, stream: str = "out") -> str:
        """Every rank's lines, prefixed with the rank as ``srun --label`` does."""
        lines = []
        for rank, text in self.logs(stream).items():
            lines += [f"{rank}: {line}" for line in text.splitlines()]
        return "\n".join(lines) + ("\n" if lines else "")

    def batch_log(self) -> str:
        """Slurm's log of the batch script (``slurm-<jobid>.out``): srun's own errors land here."""
        return read_untrusted_log(self.directory / f"slurm-{self.id}.out", LOG_LIMIT)

    def output_notebook(self) -> dict | None:
        """A notebook job's executed notebook (``notebook.output_info``); None for other jobs."""
        return notebooks.output_info(self.directory, self.record.run)

    def as_dict(self, status: bool = False) -> dict:
        """The job as the REST API and the UI see it."""
        data = {
            "id": self.id,
            "directory": str(self.directory),
            "name": self.record.id,
            "submitted": self.submitted,
            "script": str(self.script_path),
            "spec": self.record.spec,
            "run": self.record.run,
            "output": self.output_notebook(),
        }
        current = (
            self.status() if status else (JobStatus.from_dict(self.record.final) if self.record.final else self._status)
        )
        data["status"] = current.as_dict() if current else None
        return data


def _prepare_inputs(spec: JobSpec, staging: Path, directory: Path) -> tuple[RunTarget, dict]:
    """Copy or convert the spec's inputs into ``staging``; the run target refers to ``directory``."""
    if spec.command is not None:
        return RunTarget(tuple(spec.command)), {"kind": "command", "argv": list(spec.command)}
    if spec.python_script:
        source = Path(spec.python_script).expanduser()
        if not source.is_file():
            raise JobSpecError(f"python_script {source} does not exist or is not a file")
        if source.name in RESERVED:
            raise JobSpecError(f"python_script may not be named {source.name} (the job directory's own file)")
        shutil.copy2(source, staging / source.name)
        argv = (*PYTHON, str(directory / source.name), *spec.args)
        return RunTarget(argv, "python_script"), {
            "kind": "python_script",
            "argv": list(argv),
            "source": str(source.resolve()),
            "inputs": [source.name],
        }
    return notebooks.target(spec, staging, directory)


def _remove_stale_staging(root: Path) -> None:
    cutoff = time.time() - _STALE_STAGING
    for stale in root.glob(".*.tmp"):
        try:
            if stale.is_dir() and stale.stat().st_mtime < cutoff:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            pass


__all__ = ["Job", "JobError", "JobNotFound", "JobRecord", "JobTimeout", "default_root"]
