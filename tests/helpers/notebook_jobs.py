"""A notebook job whose ranks run the runner (nbrunner.py and its modules) as subprocesses,
Slurm's variables set by hand; its finish as the batch script runs it, and its output notebook."""

import os
import subprocess
import sys

import nbformat

from jupyter_podman_hpc.slurm.notebook import prepare
from jupyter_podman_hpc.slurm.script import finish_argv

BARE_PYTHON = "/usr/bin/python3"  # Debian's, no site packages: no IPython, nbformat or this package


def notebook_job(tmp_path, cells, name="nb", **options):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("# Title")] + [
        c if isinstance(c, nbformat.NotebookNode) else nbformat.v4.new_code_cell(c) for c in cells
    ]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    source = tmp_path / f"{name}.ipynb"
    nbformat.write(notebook, str(source))
    directory = tmp_path / "job"
    directory.mkdir()
    prepare(source, directory, **options)
    return directory


def run_rank(directory, number, size=2, python=sys.executable, wait=True, extra_env=None, args=()):
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(directory),
        "SLURM_PROCID": str(number),
        "SLURM_NTASKS": str(size),
        "SLURMD_NODENAME": f"n{number + 1}",
        "SLURM_JOB_ID": "4242",
        **(extra_env or {}),
    }
    argv = [python, "-u", str(directory / "nbrunner.py"), str(directory / "nbrun" / "plan.json"), *args]
    process = subprocess.Popen(argv, cwd=directory, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return process
    out, err = process.communicate(timeout=120)
    return process.returncode, out, err


def finish_job(directory, code):
    """The finish as the batch script runs it: this package's runner, not the job directory's copy."""
    subprocess.run(
        [*finish_argv(str(directory / "nbrun" / "plan.json")), str(code)], check=True, timeout=60, cwd=directory
    )


def output_notebook(directory, name="nb"):
    text = (directory / "out" / f"{name}.out.ipynb").read_text()
    notebook = nbformat.reads(text, as_version=4)
    nbformat.validate(notebook)  # written by hand, valid nbformat 4
    return notebook
