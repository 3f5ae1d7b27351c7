"""Faults seen from the Jupyter fronts: a real jupyter_server with our extension (pytest-jupyter,
in-process) and a real IPython kernel with the magics, as in tests/integration/server and
tests/integration/magics, whose fixtures these are."""

from pytest_jupyter.jupyter_core import *  # noqa: F401,F403 - its fixtures and async test support
from pytest_jupyter.jupyter_server import *  # noqa: F401,F403

from tests.integration.server.conftest import api, job_root, jp_server_config  # noqa: F401 (fixtures)
