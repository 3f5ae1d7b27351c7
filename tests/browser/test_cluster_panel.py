"""Interactive clusters in the Lab: "Run at scale" → "Interactive cluster" starts one in the
notebook's kernel (a new cell runs the magic); the Containers panel lists it with its engines
and stops it."""

from __future__ import annotations

import uuid

import nbformat
import pytest

from tests.browser.lab import open_dialog, open_notebook, open_panel
from tests.helpers.commands import run

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]


def queued(stack, job_id: str) -> str:
    return run(["squeue", "-h", "-j", job_id, "-t", "PD,R,CG", "-o", "%i"]).stdout.strip()


@pytest.mark.timeout(600)
def test_an_interactive_cluster_from_run_at_scale_is_listed_with_its_engines_and_stopped(
    page, console, stack_lab, artifacts
):
    stack = stack_lab.stack
    name = f"cluster-{uuid.uuid4().hex[:6]}.ipynb"
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("1 + 1")]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, stack_lab.root_dir / name)
    open_notebook(page, stack_lab, console, name)

    dialog = open_dialog(page)
    dialog.locator('select[name="image"]').select_option(stack.base_image)
    dialog.locator('input[name="nodes"]').fill("2")
    dialog.locator('input[name="tasks_per_node"]').fill("1")
    dialog.locator('select[name="run_as"]').select_option("cluster")
    page.screenshot(path=str(artifacts / "run-at-scale-interactive-cluster.png"))
    dialog.locator(".jp-PodmanHpc-submitButton").click()
    dialog.wait_for(state="detached", timeout=60_000)

    # the new cell runs the magic in the notebook's kernel
    cell = page.locator(".jp-Notebook .jp-CodeCell", has_text="%podman_hpc cluster start").first
    cell.wait_for(state="visible", timeout=30_000)
    cell.locator(".jp-OutputArea", has_text="engines, job").wait_for(state="visible", timeout=300_000)

    panel = open_panel(page)
    section = panel.locator("#jp-PodmanHpc-clusters")
    if not section.locator(".jp-PodmanHpc-sectionBody").is_visible():  # collapsed: expand it
        panel.locator(".lm-AccordionPanel-title", has_text="Clusters").click()
    row = section.locator(".jp-PodmanHpc-cluster")
    row.locator(".jp-PodmanHpc-clusterEngines", has_text="2/2 engines").wait_for(state="visible", timeout=60_000)
    assert row.count() == 1
    assert row.locator(".jp-PodmanHpc-state").inner_text() == "RUNNING"
    cluster_id = row.get_attribute("data-cluster-id")
    job_id = row.locator(".jp-PodmanHpc-jobId").inner_text().lstrip("#")
    assert queued(stack, job_id) == job_id
    page.screenshot(path=str(artifacts / "containers-panel-clusters.png"))

    row.locator(".jp-PodmanHpc-stopCluster").click()
    page.locator(".jp-Dialog button", has_text="Stop cluster").click()
    section.locator(f'.jp-PodmanHpc-cluster[data-cluster-id="{cluster_id}"]').wait_for(state="detached", timeout=90_000)
    assert queued(stack, job_id) == ""
    assert console.errors == [], f"console errors:\n{console}"
