"""What the Slurm API's stack tests share: the store a job's ranks read, and a jobs root on the shared scratch."""

import shutil

import pytest

STORE_VARS = ("SQUASH_DIR", "PODMANHPC_GRAPH_ROOT", "PODMANHPC_RUN_ROOT", "PODMANHPC_CONFIG_HOME")


def store_env(hpc) -> dict[str, str]:
    """The variables that point a job's ranks at ``hpc``'s squashed store and storage (the spec's
    ``environment``: the batch script carries them, not the test's own environment)."""
    return {name: hpc.env[name] for name in STORE_VARS}


@pytest.fixture
def root(stack):
    """A fresh jobs root every node sees, removed afterwards."""
    path = stack.work_dir("jobs")
    yield path
    shutil.rmtree(path, ignore_errors=True)
