"""Browser fixtures: a real JupyterLab and Debian's chromium driven by Playwright.

`jupyterlab` starts `jupyter lab` from the running interpreter's environment
(the one the project is installed in) on 127.0.0.1, with a token, a
throwaway root directory and throwaway Jupyter config/data/runtime/settings
directories, so a user's own settings cannot change what a test sees. The
installed extensions (sys.prefix/share/jupyter, sys.prefix/etc/jupyter) are
still found: that is what is under test.

`stack_lab` is such a JupyterLab on the cluster-in-a-box: its server extension
uses the engine storage of `squashed_base` (below: a private graph root and a
squashed store holding the base image) and writes job
directories to the shared scratch (`c.PodmanHPC.job_root`), since the nodes
write the ranks' logs there. Tests that use it need the stack.

`page` is a fresh chromium page (fresh profile) whose console messages and
uncaught page errors are collected in `console`. A screenshot of every test's
page is written to tests/artifacts/ (or, if the checkout is not writable by
the test user, to pytest's temporary directory; the path is in `artifacts`).

Playwright never downloads a browser here: it drives /usr/bin/chromium.

Here: `jupyterlab` and the browser tests' own `squashed_base`. `stack_lab`, `page`, `console` and
`artifacts` are in tests/conftest.py (the attack tests use them too); the JupyterLab they start
and the console log are in tests/helpers/browser.py.
"""

from __future__ import annotations

import pytest

from tests.helpers.browser import JupyterLab, running_lab
from tests.helpers.hpc import squashed_store


@pytest.fixture(scope="session")
def jupyterlab(tmp_path_factory) -> JupyterLab:
    """A JupyterLab server of this environment on 127.0.0.1; stopped at the end."""
    with running_lab(tmp_path_factory.mktemp("jupyterlab")) as lab:
        yield lab


@pytest.fixture(scope="session")
def squashed_base(stack):
    """The browser tests' own squashed store holding the base image (``stack_lab``'s, in
    tests/conftest.py), apart from the other folders' so that the session-long JupyterLab's
    containers are never in their storage."""
    yield from squashed_store(stack, stack.base_image)
