"""What the job tests share: a stand-in for Slurm, a site whose squashed store holds IMAGE,
a submit into a temporary job root, and a notebook job whose ranks run the runner
(nbrunner.py and its modules) as subprocesses, Slurm's variables set by hand."""

import json
import os
import subprocess
import sys

import nbformat

from jupyter_podman_hpc.engine.site.config import SiteConfig
from jupyter_podman_hpc.slurm.client import JobStatus, SlurmClient, SlurmError
from jupyter_podman_hpc.slurm.jobs import Job
from jupyter_podman_hpc.slurm.notebook import prepare
from jupyter_podman_hpc.slurm.script import finish_argv
from jupyter_podman_hpc.slurm.spec import JobSpec

IMAGE = "registry.example.org:5000/team/image:1.0"
BARE_PYTHON = "/usr/bin/python3"  # Debian's, no site packages: no IPython, nbformat or this package


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
        return {j: JobStatus(j, state, raw_state=state, exit_code=0 if state == "COMPLETED" else None,
                             nodelist="n[1-2]", nodes=("n1", "n2"), source="squeue") for j in job_ids}

    def cancel(self, job_id, *, signal=None):
        self.cancelled.append(job_id)


def squashed_config(tmp_path) -> SiteConfig:
    """A site whose squashed store holds IMAGE (its records; the nodes are not involved here)."""
    store = tmp_path / "squash"
    (store / "overlay-images").mkdir(parents=True, exist_ok=True)
    (store / "overlay-images" / "images.json").write_text(
        json.dumps([{"id": "ab" * 32, "names": [IMAGE], "layer": "cd" * 32}]))
    return SiteConfig(squash_dir=str(store))


def submit(tmp_path, spec=None, client=None, **kwargs):
    spec = spec or JobSpec(image=IMAGE, command=["echo", "hi"], nodes=2, tasks_per_node=2)
    return Job.submit(spec, tmp_path / "jobs", client=client or StandInSlurm(), config=squashed_config(tmp_path),
                      **kwargs)


# --- the notebook runner as the ranks run it ---------------------------------------------------

def notebook_job(tmp_path, cells, name="nb", **options):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("# Title")] + [
        c if isinstance(c, nbformat.NotebookNode) else nbformat.v4.new_code_cell(c) for c in cells]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    source = tmp_path / f"{name}.ipynb"
    nbformat.write(notebook, str(source))
    directory = tmp_path / "job"
    directory.mkdir()
    prepare(source, directory, **options)
    return directory


def run_rank(directory, number, size=2, python=sys.executable, wait=True, extra_env=None, args=()):
    env = {"PATH": os.environ["PATH"], "HOME": str(directory), "SLURM_PROCID": str(number),
           "SLURM_NTASKS": str(size), "SLURMD_NODENAME": f"n{number + 1}", "SLURM_JOB_ID": "4242",
           **(extra_env or {})}
    argv = [python, "-u", str(directory / "nbrunner.py"), str(directory / "nbrun" / "plan.json"), *args]
    process = subprocess.Popen(argv, cwd=directory, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    if not wait:
        return process
    out, err = process.communicate(timeout=120)
    return process.returncode, out, err


def finish_job(directory, code):
    """The finish as the batch script runs it: this package's runner, not the job directory's copy."""
    subprocess.run([*finish_argv(str(directory / "nbrun" / "plan.json")), str(code)], check=True, timeout=60,
                   cwd=directory)


def output_notebook(directory, name="nb"):
    text = (directory / "out" / f"{name}.out.ipynb").read_text()
    notebook = nbformat.reads(text, as_version=4)
    nbformat.validate(notebook)  # written by hand, valid nbformat 4
    return notebook
