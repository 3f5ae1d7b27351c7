"""A real jupyter_server with our extension, in-process (pytest-jupyter), on the real stack.

The ``api`` and ``job_root`` fixtures are in tests/conftest.py (tests/faults/jupyter uses them too);
``jp_server_config`` is named here, after pytest-jupyter's own, which it replaces.
"""

import pytest
from pytest_jupyter.jupyter_core import *  # noqa: F403 - its fixtures and async test support
from pytest_jupyter.jupyter_server import *  # noqa: F403

from tests.helpers.hpc import cleanup_hpc, make_hpc
from tests.helpers.server_extension import server_config


@pytest.fixture
def server_hpc(stack, monkeypatch):
    """The server's engine environment: a private graph root and squashed store holding the tiny image."""
    hpc = make_hpc(stack, "server")
    hpc("pull", stack.tiny_image)
    hpc.wipe_local_storage()
    for key in ("PODMANHPC_GRAPH_ROOT", "PODMANHPC_RUN_ROOT", "PODMANHPC_CONFIG_HOME", "SQUASH_DIR"):
        monkeypatch.setenv(key, hpc.env[key])
    yield hpc
    cleanup_hpc(hpc)


@pytest.fixture
def jp_server_config(jp_root_dir, job_root):
    """pytest-jupyter's server configuration, replaced by our extension's (tests/integration/server's)."""
    return server_config(job_root)
