"""Fixtures for the site deployment: the wheel dev/stack builds and the site environment.

dev/stack (dev/stacklib/site.py) builds the project's wheel, collects it with
every wheel it needs in $STACK_SITE_WHEELHOUSE, and installs it, non-editable,
with JupyterHub and batchspawner into $STACK_SITE_VENV.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _required(name: str) -> Path:
    value = os.environ.get(name)
    if not value or not Path(value).is_dir():
        message = f"${name} is not a directory: run `dev/stack up` (as root) to build the site environment"
        if os.environ.get("STACK_REQUIRED"):
            pytest.fail(message)
        pytest.skip(message)
    return Path(value)


@pytest.fixture(scope="session")
def wheelhouse(stack) -> Path:
    return _required("STACK_SITE_WHEELHOUSE")


@pytest.fixture(scope="session")
def site_venv(stack) -> Path:
    return _required("STACK_SITE_VENV")
