"""Fixtures for the site deployment: the wheel dev/stack builds (``wheelhouse``); the site
environment (``site_venv``) is in tests/conftest.py, shared with the browser tests.

dev/stack (dev/stacklib/site.py) builds the project's wheel, collects it with
every wheel it needs in $STACK_SITE_WHEELHOUSE, and installs it, non-editable,
with JupyterHub and batchspawner into $STACK_SITE_VENV.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.stack import required_directory


@pytest.fixture(scope="session")
def wheelhouse(stack) -> Path:
    return required_directory("STACK_SITE_WHEELHOUSE")
