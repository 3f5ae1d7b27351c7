"""The one place that talks to Slurm: sbatch, squeue, sacct, scontrol, scancel and sinfo.

Commands run as argument lists (never through a shell) with a timeout; a
failure becomes ``SlurmError`` carrying Slurm's own message. Job states are
normalized to PENDING, RUNNING, COMPLETED, FAILED, CANCELLED and TIMEOUT
(UNKNOWN when Slurm has no record); the raw state and a reason stay
available. The parsers are plain functions so they can be tested on sample
outputs.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..engine.base import commands
from ..engine.errors import EngineError
from .spec import elapsed_seconds

STATES = ("PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "UNKNOWN")
FINISHED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"})

# Slurm's job states (squeue %T, sacct State) -> (our state, a reason worth showing).
_STATE_MAP = {
    "PENDING": ("PENDING", ""),
    "CONFIGURING": ("PENDING", "nodes are being configured"),
    "REQUEUED": ("PENDING", "requeued"),
    "REQUEUE_HOLD": ("PENDING", "requeued and held"),
    "REQUEUE_FED": ("PENDING", "requeued"),
    "RESV_DEL_HOLD": ("PENDING", "held: reservation deleted"),
    "RUNNING": ("RUNNING", ""),
    "COMPLETING": ("RUNNING", "completing"),
    "SUSPENDED": ("RUNNING", "suspended"),
    "STOPPED": ("RUNNING", "stopped"),
    "SIGNALING": ("RUNNING", "being signalled"),
    "STAGE_OUT": ("RUNNING", "staging out"),
    "RESIZING": ("RUNNING", "resizing"),
    "COMPLETED": ("COMPLETED", ""),
    "FAILED": ("FAILED", ""),
    "BOOT_FAIL": ("FAILED", "node boot failure"),
    "NODE_FAIL": ("FAILED", "node failure"),
    "OUT_OF_MEMORY": ("FAILED", "out of memory"),
    "SPECIAL_EXIT": ("FAILED", "special exit"),
    "REVOKED": ("FAILED", "revoked by a sibling cluster"),
    "CANCELLED": ("CANCELLED", ""),
    "PREEMPTED": ("CANCELLED", "preempted"),
    "TIMEOUT": ("TIMEOUT", ""),
    "DEADLINE": ("TIMEOUT", "deadline reached"),
}
# Slurm's short codes (squeue %t), for completeness.
_SHORT = {
    "PD": "PENDING",
    "CF": "CONFIGURING",
    "R": "RUNNING",
    "CG": "COMPLETING",
    "CD": "COMPLETED",
    "F": "FAILED",
    "CA": "CANCELLED",
    "TO": "TIMEOUT",
    "NF": "NODE_FAIL",
    "OOM": "OUT_OF_MEMORY",
    "PR": "PREEMPTED",
    "BF": "BOOT_FAIL",
    "DL": "DEADLINE",
    "S": "SUSPENDED",
    "ST": "STOPPED",
    "RQ": "REQUEUED",
    "RH": "REQUEUE_HOLD",
    "RF": "REQUEUE_FED",
    "SE": "SPECIAL_EXIT",
    "SI": "SIGNALING",
    "SO": "STAGE_OUT",
    "RS": "RESIZING",
    "RV": "REVOKED",
    "RD": "RESV_DEL_HOLD",
}

SQUEUE_FORMAT = "%i|%T|%N|%M|%S|%e|%r"
SACCT_FIELDS = "JobID,State,ExitCode,NodeList,Elapsed,Start,End,Reason"
SINFO_FORMAT = "%P|%a|%D|%l|%F"


class SlurmError(EngineError):
    """A Slurm command failed; the message is Slurm's own. Mostly Slurm refusing what was
    asked (a partition, an account, a limit), so the REST API answers 400 as for bad input."""


def normalize_state(raw: str) -> tuple[str, str]:
    """A Slurm state (``CANCELLED by 1001``, ``OUT_OF_MEMORY``, ``CG``...) -> (state, reason)."""
    word = raw.strip().split(" ", 1)[0].rstrip("+").upper()
    word = _SHORT.get(word, word)
    return _STATE_MAP.get(word, ("UNKNOWN", raw.strip().lower()))


def _bracket_choices(inner: str) -> list[str]:
    """The names a bracket's inside stands for (``01-03,7`` -> 01, 02, 03, 7), zero-padded as written."""
    choices: list[str] = []
    for rng in inner.split(","):
        low, _, high = rng.partition("-")
        if high:
            choices += [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]
        else:
            choices.append(low)
    return choices


def _expand_item(item: str) -> list[str]:
    """One host-list item (``n[1-3]x[a,b]``) as names: each bracket multiplies the names so far."""
    expanded = [""]
    for part in re.split(r"(\[[^\]]*\])", item):
        choices = _bracket_choices(part[1:-1]) if part.startswith("[") else [part]
        expanded = [prefix + choice for prefix in expanded for choice in choices]
    return expanded


def expand_nodelist(text: str) -> tuple[str, ...]:
    """Slurm's host list (``n[1-3,5],login1``) as names, in order."""
    text = text.strip()
    if not text or text in ("None assigned", "(null)", "None"):
        return ()
    items = re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", text)
    return tuple(name for item in items for name in _expand_item(item))


def _time(text: str) -> str | None:
    text = text.strip()
    return None if text in ("", "N/A", "NONE", "None", "Unknown", "(null)") else text


@dataclass(frozen=True)
class JobStatus:
    """Where a job is: its normalized state and what Slurm says about it."""

    job_id: str
    state: str  # one of STATES
    raw_state: str = ""  # Slurm's word, e.g. "CANCELLED by 1001", "OUT_OF_MEMORY"
    reason: str = ""  # why it is pending, or what the raw state adds
    exit_code: int | None = None  # the batch script's exit code, when finished
    signal: int | None = None  # the signal that ended it, when one did
    nodelist: str = ""
    nodes: tuple[str, ...] = ()
    elapsed: int | None = None  # seconds
    start: str | None = None  # ISO 8601 as Slurm prints it
    end: str | None = None
    source: str = ""  # "squeue", "sacct" or "record"

    @property
    def finished(self) -> bool:
        """The job has ended (completed, failed, cancelled or timed out): its state will not change again."""
        return self.state in FINISHED

    def describe(self) -> str:
        """One line: ``job 84 FAILED (exit code 3) on n[1-4] after 7 s``."""
        text = f"job {self.job_id} {self.state}"
        details = self._details()
        if details:
            text += f" ({', '.join(details)})"
        if self.state == "PENDING":
            return text
        if self.nodelist:
            text += f" on {self.nodelist}"
        if self.elapsed is not None:
            text += f" after {self.elapsed} s"
        return text

    def _details(self) -> list[str]:
        """What ``describe`` puts in parentheses: the reason, an exit code worth showing, the signal."""
        shown = (
            (self.reason, bool(self.reason) and self.reason.lower() != "none"),
            (f"exit code {self.exit_code}", self._exit_code_worth_showing()),
            (f"signal {self.signal}", bool(self.signal)),
        )
        return [text for text, show in shown if show]

    def _exit_code_worth_showing(self) -> bool:
        """A finished job's exit code, unless it is a completed job's 0."""
        if not self.finished or self.exit_code is None:
            return False
        return bool(self.exit_code) or self.state != "COMPLETED"

    def as_dict(self) -> dict:
        """The status as JSON-ready data, with ``finished``; ``from_dict`` reads it back."""
        data = asdict(self)
        data["nodes"] = list(self.nodes)
        data["finished"] = self.finished
        return data

    @classmethod
    def from_dict(cls, data: Mapping) -> JobStatus:
        """The status ``as_dict`` wrote (keys it does not know are ignored)."""
        known = set(cls.__dataclass_fields__)
        values = {k: v for k, v in data.items() if k in known}
        values["nodes"] = tuple(values.get("nodes") or ())
        return cls(**values)


def _rows(text: str, width: int) -> Iterator[list[str]]:
    """The ``|``-separated fields of each line of Slurm's parsable output, stripped; lines with
    fewer than ``width`` fields (blank ones, a warning) are skipped."""
    for line in text.splitlines():
        fields = [field.strip() for field in line.split("|")]
        if len(fields) >= width:
            yield fields


def _state(raw: str, reason: str) -> tuple[str, str]:
    """(our state, why) of a Slurm state; a pending job's own reason wins over the state's."""
    state, why = normalize_state(raw)
    if state == "PENDING" and reason and reason != "None":
        why = reason
    return state, why


def parse_squeue(text: str) -> dict[str, JobStatus]:
    """Lines of ``squeue -h -o '%i|%T|%N|%M|%S|%e|%r'``."""
    found: dict[str, JobStatus] = {}
    for fields in _rows(text, 7):
        job_id, raw, nodelist, used, start, end, reason = fields[:7]
        state, why = _state(raw, reason)
        found[job_id] = JobStatus(
            job_id=job_id,
            state=state,
            raw_state=raw,
            reason=why,
            nodelist=nodelist,
            nodes=expand_nodelist(nodelist),
            elapsed=elapsed_seconds(used) if state != "PENDING" else None,
            start=_time(start) if state != "PENDING" else None,
            end=_time(end) if state in FINISHED else None,
            source="squeue",
        )
    return found


def parse_sacct(text: str) -> dict[str, JobStatus]:
    """Lines of ``sacct -X -n -P --format=JobID,State,ExitCode,NodeList,Elapsed,Start,End,Reason``.

    A job listed twice (requeued) keeps its last line.
    """
    found: dict[str, JobStatus] = {}
    for fields in _rows(text, 7):
        job_id, raw, exit_code, nodelist, elapsed, start, end = fields[:7]
        state, why = _state(raw, fields[7] if len(fields) > 7 else "")
        code = signal = None
        match = re.fullmatch(r"(\d+):(\d+)", exit_code)
        if match and state in FINISHED:
            code, signal = int(match.group(1)), int(match.group(2))
        found[job_id] = JobStatus(
            job_id=job_id,
            state=state,
            raw_state=raw,
            reason=why,
            exit_code=code,
            signal=signal or None,
            nodelist="" if nodelist == "None assigned" else nodelist,
            nodes=expand_nodelist(nodelist),
            elapsed=elapsed_seconds(elapsed) if state != "PENDING" else None,
            start=_time(start),
            end=_time(end) if state in FINISHED else None,
            source="sacct",
        )
    return found


def parse_scontrol_exit_code(text: str) -> tuple[int | None, int | None]:
    """(exit code, signal) from ``scontrol show job -o``'s ``ExitCode=N:S``; (None, None) if absent."""
    match = re.search(r"(?:^|\s)ExitCode=(\d+):(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else (None, None)


@dataclass(frozen=True)
class Partition:
    """A partition as the UI shows it."""

    name: str
    default: bool
    available: str  # up, down, drain, inactive
    nodes: int
    idle: int
    allocated: int
    other: int
    time_limit: str  # Slurm's form, e.g. "infinite", "1-00:00:00"
    time_limit_seconds: int | None = None  # None when unlimited

    @property
    def state(self) -> str:
        """The partition's availability as sinfo reports it (up, down, drain, inactive)."""
        return self.available

    def as_dict(self) -> dict:
        """The partition as JSON-ready data, for the UI."""
        return asdict(self)


def parse_sinfo(text: str) -> list[Partition]:
    """Lines of ``sinfo -h -o '%P|%a|%D|%l|%F'``; a partition split over lines is summed."""
    partitions: dict[str, Partition] = {}
    for fields in _rows(text, 5):
        if not fields[0]:
            continue
        raw_name, available, count, limit, counts = fields[:5]
        name = raw_name.rstrip("*")
        try:
            allocated, idle, other, total = (int(n) for n in counts.split("/"))
        except ValueError:
            allocated = idle = other = 0
            total = int(count) if count.isdigit() else 0
        seconds = elapsed_seconds(limit) if limit.lower() not in ("infinite", "n/a") else None
        before = partitions.get(name)
        if before is not None:
            allocated, idle, other, total = (
                allocated + before.allocated,
                idle + before.idle,
                other + before.other,
                total + before.nodes,
            )
        partitions[name] = Partition(
            name=name,
            default=raw_name.endswith("*") or bool(before and before.default),
            available=available,
            nodes=total,
            idle=idle,
            allocated=allocated,
            other=other,
            time_limit=limit,
            time_limit_seconds=seconds,
        )
    return list(partitions.values())


def _checked_ids(job_ids: Iterable[str]) -> list[str]:
    """Job ids as strings (``123``, ``123_4``, ``123+1``); SlurmError for one that is none."""
    ids = [str(j) for j in job_ids]
    for job_id in ids:
        if not re.fullmatch(r"\d+(?:[_+]\d+)?", job_id):
            raise SlurmError(f"{job_id!r} is not a Slurm job id")
    return ids


def _needs_sacct(queued: JobStatus | None) -> bool:
    """Whether to ask sacct about a job squeue showed as ``queued`` (None: not at all)."""
    # squeue has no exit code, and forgets jobs MinJobAge after they end.
    return queued is None or queued.finished or queued.reason == "completing"


def _with_whole_allocation(accounted: JobStatus, live: JobStatus | None) -> JobStatus:
    """sacct's status of a job with squeue's node list when squeue's holds more nodes."""
    if live is not None and len(live.nodes) > len(accounted.nodes):
        # slurmdbd may not have the whole allocation yet, just after the end
        return replace(accounted, nodelist=live.nodelist, nodes=live.nodes)
    return accounted


def _slurm_message(stderr: str, command: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    line = (errors or lines or [f"{command} failed"])[-1]
    line = re.sub(rf"^{re.escape(command)}: error: ", "", line)
    return f"{command}: {line}"


# scancel's errors about a job that already ended: cancelling it is not an error.
_ALREADY_ENDED = ("already completing or completed", "Job/step already completing")


def _scancel_errors(stderr: str) -> list[str]:
    """scancel's error lines, but those saying the job had already ended."""
    return [
        line for line in stderr.splitlines() if "error:" in line and not any(ended in line for ended in _ALREADY_ENDED)
    ]


# What a user sets for Slurm's commands themselves. Every other SLURM_* variable in a job's
# environment is Slurm's description of that job and its step.
SUBMITTER_SETTINGS = frozenset(
    {"SLURM_CONF", "SLURM_CLUSTERS", "SLURM_DEBUG_FLAGS", "SLURM_EXIT_ERROR", "SLURM_TIME_FORMAT"}
)


def submission_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The environment sbatch runs with: ``env``, but inside a Slurm job (a Jupyter server that
    batchspawner started on a compute node) without the variables Slurm set for that job.

    sbatch hands its whole environment to the new job, where Slurm sets only some of its own
    variables again; the enclosing job's others stay, and some of them act as options. Its
    SLURM_EXPORT_ENV (batchspawner's ``--export`` list) made the new job's srun pass only the
    listed variables to the ranks, so what the batch script exports (``--env``) never reached
    them; its SLURM_GET_USER_ENV=1 made slurmd load the user's login environment into every job.
    """
    if not (env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")):
        return dict(env)
    return {
        name: value
        for name, value in env.items()
        if name in SUBMITTER_SETTINGS or not name.startswith(("SLURM_", "SLURMD_"))
    }


@dataclass
class SlurmClient:
    """Slurm's commands with one environment (``SLURM_CONF``, PATH...) and a timeout."""

    env: Mapping[str, str] | None = None
    timeout: float = 60.0
    commands: dict[str, str] = field(default_factory=dict)  # e.g. {"sbatch": "/opt/slurm/bin/sbatch"}

    def _run(
        self, command: str, args: Sequence[str], *, cwd: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:
        argv = [self.commands.get(command, command), *map(str, args)]
        env = dict(os.environ if self.env is None else self.env)
        if command == "sbatch":
            env = submission_environment(env)
        try:
            result = commands.run(
                argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=self.timeout, stdin=subprocess.DEVNULL
            )
        except FileNotFoundError:
            raise SlurmError(f"{command} not found: is Slurm installed and on PATH?", 127)
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{command} did not answer within {self.timeout:.0f} s: is slurmctld up?")
        if check and result.returncode != 0:
            raise SlurmError(_slurm_message(result.stderr, command), 125)
        return result

    # --- jobs -------------------------------------------------------------------

    def submit(self, script_path: str | os.PathLike, *, cwd: str | None = None, options: Sequence[str] = ()) -> str:
        """``sbatch --parsable [options] script``; returns the job id. From inside a job, the new
        job does not inherit the enclosing one's Slurm variables (``submission_environment``)."""
        result = self._run(
            "sbatch", ["--parsable", *options, str(script_path)], cwd=cwd or str(Path(script_path).parent)
        )
        job_id = result.stdout.strip().split(";", 1)[0].strip()
        if not re.fullmatch(r"\d+(?:_\d+)?", job_id):
            raise SlurmError(f"sbatch: unexpected answer {result.stdout.strip()!r} (no job id)")
        return job_id

    def statuses(self, job_ids: Iterable[str]) -> dict[str, JobStatus]:
        """The status of several jobs: squeue for live ones, then sacct for finished ones.

        A job neither knows gets state UNKNOWN.
        """
        ids = _checked_ids(job_ids)
        if not ids:
            return {}
        found = self._queued(ids)
        ask = [job_id for job_id in ids if _needs_sacct(found.get(job_id))]
        if ask:
            found.update(self._accounted(ask, found))
        self._add_exit_codes(found, ask)
        for job_id in ids:
            found.setdefault(job_id, JobStatus(job_id, "UNKNOWN", reason="Slurm has no record of this job"))
        return found

    def _queued(self, ids: list[str]) -> dict[str, JobStatus]:
        """squeue's statuses of ``ids``; none when squeue knows none of them."""
        result = self._run("squeue", ["-h", "-t", "all", "-j", ",".join(ids), "-o", SQUEUE_FORMAT], check=False)
        if result.returncode == 0:
            return {k: v for k, v in parse_squeue(result.stdout).items() if k in ids}
        if "Invalid job id" not in result.stderr:
            raise SlurmError(_slurm_message(result.stderr, "squeue"))
        return {}

    def _accounted(self, ask: list[str], queued: Mapping[str, JobStatus]) -> dict[str, JobStatus]:
        """sacct's statuses of ``ask`` that replace squeue's ``queued`` ones: finished jobs, and jobs
        squeue no longer knows. A failing sacct is an error only when squeue knew none of the jobs."""
        result = self._run("sacct", ["-X", "-n", "-P", "-j", ",".join(ask), f"--format={SACCT_FIELDS}"], check=False)
        if result.returncode != 0:
            if not queued:
                raise SlurmError(_slurm_message(result.stderr, "sacct"))
            return {}
        return {
            job_id: _with_whole_allocation(status, queued.get(job_id))
            for job_id, status in parse_sacct(result.stdout).items()
            if job_id in ask and (status.finished or job_id not in queued)
        }

    def _add_exit_codes(self, found: dict[str, JobStatus], ask: list[str]) -> None:
        """Jobs only squeue saw finish get slurmctld's exit code (scontrol)."""
        for job_id in ask:
            status = found.get(job_id)
            if status is not None and status.finished and status.source == "squeue":
                # slurmdbd lags slurmctld by a moment after the end; slurmctld has the exit code
                found[job_id] = self._with_exit_code(status)

    def _with_exit_code(self, status: JobStatus) -> JobStatus:
        shown = self._run("scontrol", ["show", "job", "-o", status.job_id], check=False)
        code, signal = parse_scontrol_exit_code(shown.stdout) if shown.returncode == 0 else (None, None)
        return status if code is None else replace(status, exit_code=code, signal=signal or None)

    def status(self, job_id: str) -> JobStatus:
        """The status of one job; SlurmError if Slurm has no record of it."""
        status = self.statuses([str(job_id)])[str(job_id)]
        if status.state == "UNKNOWN" and not status.raw_state:
            raise SlurmError(f"Slurm has no record of job {job_id} (neither squeue nor sacct knows it)")
        return status

    def in_queue(self, job_id: str) -> bool:
        """Whether slurmctld still holds the job: pending, running, or completing (cleaning up its nodes)."""
        if not re.fullmatch(r"\d+(?:_\d+)?", str(job_id)):
            raise SlurmError(f"{job_id!r} is not a Slurm job id")
        result = self._run(
            "squeue", ["-h", "-j", str(job_id), "-t", "PD,CF,R,CG,S,RQ,RS,RH,SO", "-o", "%i"], check=False
        )
        if result.returncode != 0 and "Invalid job id" not in result.stderr:
            raise SlurmError(_slurm_message(result.stderr, "squeue"))
        return str(job_id) in result.stdout.split()

    def cancel(self, job_id: str, *, signal: str | None = None) -> None:
        """``scancel``; cancelling a job that already ended is not an error."""
        if not re.fullmatch(r"\d+(?:_\d+)?", str(job_id)):
            raise SlurmError(f"{job_id!r} is not a Slurm job id")
        args = [f"--signal={signal}"] if signal else []
        # scancel exits 0 even when it fails, and says why only when verbose: read its error lines.
        result = self._run("scancel", ["--verbose", *args, str(job_id)], check=False)
        errors = _scancel_errors(result.stderr)
        if result.returncode != 0 or errors:
            raise SlurmError(_slurm_message("\n".join(errors) or result.stderr, "scancel"))

    # --- the cluster ----------------------------------------------------------------

    def partitions(self) -> list[Partition]:
        """The cluster's partitions, from one sinfo call; SlurmError when sinfo fails."""
        return parse_sinfo(self._run("sinfo", ["-h", "-o", SINFO_FORMAT]).stdout)
