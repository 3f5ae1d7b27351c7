"""Faults seen from the Jupyter fronts: a real jupyter_server with our extension (pytest-jupyter,
in-process) and a real IPython kernel with the magics, as in tests/integration/server and
tests/integration/magics. Their ``api`` and ``job_root`` fixtures are in tests/conftest.py; the
server's configuration is the one tests/integration/server uses (tests/helpers/server_extension.py),
named here after pytest-jupyter's own."""

import pytest
from pytest_jupyter.jupyter_core import *  # noqa: F403 - its fixtures and async test support
from pytest_jupyter.jupyter_server import *  # noqa: F403

from tests.helpers.server_extension import server_config


@pytest.fixture
def jp_server_config(jp_root_dir, job_root):
    """pytest-jupyter's server configuration, replaced by our extension's (tests/integration/server's)."""
    return server_config(job_root)


@pytest.fixture
def jobs_root(hpc):
    """Where the magic's kernel ($SCRATCH, tests/integration/magics) and the server find jobs."""
    return hpc.work / "scratch" / "podman-hpc" / "jobs"
