"""Where a task sits in its Slurm job step (job, step, node, rank on the node), and what a
container of the step gets from the task: its Slurm/PMI variables and its PMI descriptor."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ... import stepsocket


@dataclass(frozen=True)
class StepContext:
    """Where this task sits: its job step, node and rank on the node."""

    job_id: str
    step_id: str
    node: str
    local_id: int
    tasks_on_node: int

    @property
    def key(self) -> str:
        """The step's key (job, step, node), which names its socket and its container; one definition, in
        stepsocket."""
        return stepsocket.step_key(self.job_id, self.step_id, self.node)

    def container_name(self, uid: int) -> str:
        """The name of the step's container on this node for the user ``uid``."""
        return stepsocket.container_name(uid, self.key)


def tasks_per_node(value: str) -> list[int]:
    """Slurm's compressed count list: "2(x3),1" -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in value.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise ValueError(value)
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def step_context(config, environ: Mapping[str, str]) -> StepContext:
    """The task's place in its step, from the Slurm environment (a lone task outside Slurm;
    a job's batch script, outside a step, is step 0). In a step, its key is the step socket's
    (``stepsocket.environ_step_key``)."""
    node = stepsocket.node_name(environ)
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job:
        return StepContext(f"pid{os.getpid()}", "0", node, 0, 1)
    job, step, node = stepsocket.step_ids(environ) or (job, "0", node)
    local_id = int(environ.get(config.localid_var) or 0)
    raw = environ.get(config.tasks_per_node_var, "1")
    try:
        counts = tasks_per_node(raw)
        node_index = int(environ.get("SLURM_NODEID") or 0)
        count = counts[node_index] if node_index < len(counts) else counts[0]
    except (ValueError, IndexError):
        found = re.search(config.ntasks_pattern, raw)
        count = int(found.group(0)) if found else 1
    return StepContext(job, step, node, local_id, max(count, 1))


def in_slurm_step(environ: Mapping[str, str]) -> bool:
    """The process runs inside a Slurm job step (srun), not only a job's batch script."""
    return bool(environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID"))


def step_env_args(config, environ: Mapping[str, str]) -> list[str]:
    """In a Slurm step, a per-process container gets the task's Slurm/PMI environment
    (the same ``shared_run_exec_args`` patterns podman-exec mode passes to each exec)."""
    return list(config.shared_run_exec_args) if in_slurm_step(environ) else []


@dataclass
class Passthrough:
    """How this task's PMI file descriptor reaches the container (podman-hpc's PMI_FD)."""

    run_args: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None
    fds: tuple[int, ...] = ()


def pmi_fd_passthrough(environ: Mapping[str, str]) -> Passthrough:
    """Duplicate PMI_FD to fd 3 and have podman pass one extra descriptor."""
    moved = stepsocket.move_pmi_fd(environ)
    if not moved:
        return Passthrough()
    return Passthrough(stepsocket.pmi_fd_args(environ), {**environ, **moved}, (stepsocket.PMI_FD,))
