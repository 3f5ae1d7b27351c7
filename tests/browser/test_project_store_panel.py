"""The Containers panel shows the store of an image that comes from a project store."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.browser.lab import open_lab, open_panel
from tests.helpers.browser import ENGINE_VARIABLES, running_lab
from tests.helpers.commands import run
from tests.helpers.hpc import cleanup_hpc, make_hpc

pytestmark = [pytest.mark.browser, pytest.mark.integration]


@pytest.fixture
def project_lab(stack, tmp_path):
    """JupyterLab whose engine has a project store (holding the tiny image) as an additional store."""
    hpc = make_hpc(stack, "panel-project")
    store = Path(os.environ["STACK_PROJECT_DIR"]) / f"panel-{uuid.uuid4().hex[:8]}"
    store.mkdir()
    store.chmod(0o2770)
    try:
        hpc("--squash-dir", store, "pull", stack.tiny_image)
        hpc.wipe_local_storage()
        env = {name: hpc.env[name] for name in ENGINE_VARIABLES}
        env["PODMANHPC_ADDITIONAL_STORES"] = str(store)
        (tmp_path / "lab").mkdir()
        with running_lab(tmp_path / "lab", env=env) as lab:
            yield lab, store
    finally:
        cleanup_hpc(hpc)
        run(["rm", "-rf", str(store)], check=False)


def test_the_panel_shows_the_project_store_of_an_image(page, console, project_lab, stack, artifacts):
    lab, store = project_lab
    open_lab(page, lab, console)
    panel = open_panel(page)
    row = panel.locator(f'.jp-PodmanHpc-image[data-image="{stack.tiny_image}"]')
    row.wait_for(state="visible", timeout=60_000)
    meta = row.locator(".jp-PodmanHpc-imageMeta").inner_text()
    assert f"squashed in {store}" in meta, meta
    assert row.get_attribute("data-squashed") == "true"
    page.screenshot(path=str(artifacts / "containers-panel-project-store.png"))
    assert console.errors == [], f"console errors:\n{console}"
