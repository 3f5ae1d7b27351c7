"""Fixtures of the magics' tests: a real IPython kernel with the magics loaded
(tests/helpers/magics_kernel.py), on the `hpc` fixture's private storage or on the squashed
store that holds the base image."""

import shutil

import pytest

from tests.helpers.magics_kernel import start_session


@pytest.fixture
def kernel(hpc, tmp_path):
    """A kernel on the `hpc` fixture's private storage (empty squashed store)."""
    session = start_session(hpc, tmp_path / "kernel")
    yield session
    session.close()


@pytest.fixture(scope="module")
def base_kernel(squashed_base, tmp_path_factory):
    """A kernel on the squashed store that holds the base image (shared by a module's tests)."""
    root = tmp_path_factory.mktemp("base-kernel")
    session = start_session(squashed_base, root)
    yield session
    session.close()
    shutil.rmtree(squashed_base.work / "scratch", ignore_errors=True)
