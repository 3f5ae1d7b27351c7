"""Notebook jobs on the stack, as the tests submit and read them: a notebook file of code cells,
the spec of a notebook run at scale in the base image, and the executed notebook it gave back."""

import nbformat

from jupyter_podman_hpc.slurm import JobSpec
from tests.helpers.hpc import store_env

TIMEOUT = 300  # seconds a notebook job may take, queueing behind other jobs included


def notebook_file(path, cells, tags=None):
    """A Python notebook at ``path`` of code cells ``cells`` (``tags``: {cell index: tag}); its path."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    for index, tag in (tags or {}).items():
        notebook.cells[index].metadata["tags"] = [tag]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, str(path))
    return str(path)


def notebook_spec(stack, hpc, notebook, **fields):
    """The notebook at ``notebook`` run in the base image of ``hpc``'s store, 2 nodes x 1 task unless
    ``fields`` say otherwise."""
    fields = {"nodes": 2, "tasks_per_node": 1, "time": "5:00", **fields}
    return JobSpec(image=stack.base_image, notebook=notebook, environment=store_env(hpc), **fields)


def executed(job):
    """The job's output notebook, read and validated as nbformat 4."""
    info = job.output_notebook()
    assert info["exists"], (job.logs("err"), job.batch_log())
    notebook = nbformat.read(info["path"], as_version=4)
    nbformat.validate(notebook)
    return notebook
