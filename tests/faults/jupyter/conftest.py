"""Faults seen from the Jupyter fronts: a real jupyter_server with our extension (pytest-jupyter,
in-process) and a real IPython kernel with the magics, as in tests/integration/server and
tests/integration/magics, whose fixtures these are."""

import pytest
from traitlets.config import Config
from pytest_jupyter.jupyter_core import *  # noqa: F401,F403 - its fixtures and async test support
from pytest_jupyter.jupyter_server import *  # noqa: F401,F403

from tests.integration.server.conftest import api, job_root, jp_server_config  # noqa: F401 (fixtures)

STORE_VARS = ("SQUASH_DIR", "PODMANHPC_GRAPH_ROOT", "PODMANHPC_RUN_ROOT", "PODMANHPC_CONFIG_HOME")


@pytest.fixture
def jobs_root(hpc):
    """Where the magic's kernel ($SCRATCH, tests/integration/magics) and the server find jobs."""
    return hpc.work / "scratch" / "podman-hpc" / "jobs"


def jobs_server_config(jobs_root) -> Config:
    """The server's configuration for a test whose jobs the magic's kernel lists too (``jobs_root``);
    a module that wants it names it in its own ``jp_server_config``, the others keep the one above."""
    return Config({"ServerApp": {"jpserver_extensions": {"jupyter_podman_hpc": True}},
                   "PodmanHPC": {"job_root": str(jobs_root)}})
