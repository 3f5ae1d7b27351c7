"""Fixtures for container kernels on the real stack that only these tests use: ``tiny_site``, a
kernel site on the squashed store that holds the tiny image (no python).

``kernel_site`` (the base image's) is in tests/conftest.py, shared with the fault and attack
tests; what these tests share besides fixtures is in tests/helpers: the kernel site
(kernel_site.py), a `jupyter server` and requests over HTTP (servers.py), a test JupyterHub
(hubs.py; tests/integration/site runs the site's), a kernel driven with jupyter_client
(kernel_clients.py) and warm pools (pools.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.kernel_site import KernelSite, site_over


@pytest.fixture
def tiny_site(squashed_tiny, tmp_path, monkeypatch) -> Iterator[KernelSite]:
    """Like kernel_site, with the squashed store that holds the tiny image (no python)."""
    yield from site_over(squashed_tiny, tmp_path, monkeypatch)
