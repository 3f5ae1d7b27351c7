"""What the job tests share without a cluster: a stand-in for Slurm (``StandInSlurm``), a site whose
squashed store holds IMAGE, and a submit into a temporary job root."""

import json

from jupyter_podman_hpc.engine.site.config import SiteConfig
from jupyter_podman_hpc.slurm.client import JobStatus, SlurmClient, SlurmError
from jupyter_podman_hpc.slurm.jobs import Job
from jupyter_podman_hpc.slurm.spec import JobSpec

IMAGE = "registry.example.org:5000/team/image:1.0"


class StandInSlurm(SlurmClient):
    """Answers as Slurm would, from a script of states; records what it was asked."""

    def __init__(self, states=("RUNNING", "COMPLETED"), refuse=None):
        super().__init__()
        self.states = list(states)
        self.refuse = refuse
        self.submitted = []
        self.cancelled = []
        self.asked = 0

    def submit(self, script_path, *, cwd=None, options=()):
        if self.refuse:
            raise SlurmError(self.refuse)
        self.submitted.append((str(script_path), cwd))
        return str(100 + len(self.submitted))

    def statuses(self, job_ids):
        self.asked += 1
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return {
            j: JobStatus(
                j,
                state,
                raw_state=state,
                exit_code=0 if state == "COMPLETED" else None,
                nodelist="n[1-2]",
                nodes=("n1", "n2"),
                source="squeue",
            )
            for j in job_ids
        }

    def cancel(self, job_id, *, signal=None):
        self.cancelled.append(job_id)


def squashed_config(tmp_path) -> SiteConfig:
    """A site whose squashed store holds IMAGE (its records; the nodes are not involved here)."""
    store = tmp_path / "squash"
    (store / "overlay-images").mkdir(parents=True, exist_ok=True)
    (store / "overlay-images" / "images.json").write_text(
        json.dumps([{"id": "ab" * 32, "names": [IMAGE], "layer": "cd" * 32}])
    )
    return SiteConfig(squash_dir=str(store))


def submit(tmp_path, spec=None, client=None, **kwargs):
    spec = spec or JobSpec(image=IMAGE, command=["echo", "hi"], nodes=2, tasks_per_node=2)
    return Job.submit(
        spec, tmp_path / "jobs", client=client or StandInSlurm(), config=squashed_config(tmp_path), **kwargs
    )
