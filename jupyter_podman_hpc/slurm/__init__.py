"""The Slurm job API: one place talks to Slurm; the magics, REST handlers and UI call it.

- ``spec``: ``JobSpec``, what a job runs and on what, validated field by field
- ``script``: ``render(spec, job_dir)``, the batch script a user would write by hand
- ``client``: the only module that runs sbatch, squeue, sacct, scontrol, scancel and sinfo
- ``jobs``: ``Job``, a job directory on the shared scratch, found again after a restart
- ``notebook``: a notebook every rank runs cell by cell; rank 0 writes the executed notebook
- ``nbrunner``: the runner, copied into the job directory (standard library only): reads the plan, runs the
  cells in order; its ``--finish`` after the step runs from this installed package, never the job
  directory's copy (the ranks write only the job's ``out/``); with ``nbcells`` (running a cell: plain Python or IPython)
  and ``nbrecorder`` (rank 0's output notebook, the other ranks' errors merged in)
- ``cluster``: interactive clusters, IPython Parallel engines as a job's ranks (its record in
  ``clusterrecord``, its controller run by ``watchdog``)

    spec = JobSpec(image="registry/image:tag", command=["python3", "-c", "print(1)"],
                   nodes=4, tasks_per_node=2)
    print(Job.preview(spec))          # the batch script, for a preview
    job = Job.submit(spec)            # $SCRATCH/podman-hpc/jobs/<id>/, sbatch
    job.wait(timeout=600)             # -> JobStatus(state="COMPLETED", exit_code=0, ...)
    job.logs()                        # {0: "...", 1: "...", ...}
"""

from .client import JobStatus, Partition, SlurmClient, SlurmError
from .jobs import Job, JobError, JobNotFound, JobTimeout, default_root
from .script import render
from .spec import JobSpec, JobSpecError

__all__ = [
    "Job",
    "JobError",
    "JobNotFound",
    "JobSpec",
    "JobSpecError",
    "JobStatus",
    "JobTimeout",
    "Partition",
    "SlurmClient",
    "SlurmError",
    "default_root",
    "render",
]
