"""Helpers for driving JupyterLab and the extension in the browser tests.

A "lab" here is anything with ``url`` (ending in "/") and ``token``: the browser tests' own
JupyterLab, or a user's server behind a hub. The helpers that open a page also use its
``lab_url(path)``.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import nbformat
import pytest

try:
    from playwright.sync_api import Error as PlaywrightError
except ImportError:  # the page fixture then says the browser tests need playwright
    PlaywrightError = Exception

ACTIVATED = "jupyter-podman-hpc is activated"
PANEL = "#jp-PodmanHpc-panel"
RUN_BUTTON = ".jp-NotebookPanel .jp-PodmanHpc-runAtScaleButton:visible"  # the current notebook's
JOB_TIMEOUT = 480_000  # ms for a submitted job to end: the nodes may be busy with other jobs first

# A notebook run at scale: every rank says who it is, and it has a parameter and a figure.
RANK_CODE = 'import os\nprint("rank", os.environ["SLURM_PROCID"])'
PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
FIGURE_CODE = (
    "import base64\nfrom IPython.display import Image, display\n"
    f"display(Image(data=base64.b64decode({PNG_B64!r})))\nprint('colour is', colour)"
)


def get_json(lab, path: str):
    request = urllib.request.Request(f"{lab.url}{path}", headers={"Authorization": f"token {lab.token}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def open_lab(page, lab, console, path: str = "lab", reset: bool = True) -> None:
    """Open JupyterLab (``path``: e.g. ``lab/tree/x.ipynb``), wait until it has restored
    its layout and our plugin has run. With ``reset``, the workspace (what earlier tests
    left open) is cleared first."""
    page.goto(lab.lab_url(path) + ("&reset" if reset else ""), wait_until="domcontentloaded", timeout=60_000)
    page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
    # The splash screen goes when the application has restored its layout.
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)
    deadline = time.monotonic() + 30
    while ACTIVATED not in console.texts("log") and time.monotonic() < deadline:
        page.wait_for_timeout(250)
    assert ACTIVATED in console.texts("log"), f"the plugin did not activate; console:\n{console}"
    # let the shell settle (a reset workspace opens its default Launcher after the restore,
    # taking the focus from whatever a test opens too early)
    try:
        page.wait_for_load_state("networkidle", timeout=10_000)
    except PlaywrightError:
        pass


def open_notebook(page, lab, console, relative: str) -> None:
    """Open a notebook of the server root; wait until its kernel is idle."""
    open_lab(page, lab, console, "lab/tree/" + urllib.parse.quote(relative))
    page.wait_for_selector(".jp-NotebookPanel .jp-Notebook", timeout=60_000)
    page.locator(RUN_BUTTON).first.wait_for(state="visible", timeout=30_000)


def open_panel(page):
    """Show the Containers panel (its tab in the left sidebar); returns its locator."""
    panel = page.locator(PANEL)
    if not panel.is_visible():
        page.locator('.jp-SideBar [data-id="jp-PodmanHpc-panel"]').first.click()
    panel.wait_for(state="visible", timeout=15_000)
    return panel


def open_dialog(page):
    """The Run at scale dialog of the current notebook, opened from its toolbar button."""
    page.locator(RUN_BUTTON).first.click()
    dialog = page.locator(".jp-PodmanHpc-runDialog")
    dialog.wait_for(state="visible", timeout=30_000)
    return dialog


def open_palette(page):
    """Open the command palette (its shortcut, else the View menu when the key press was
    lost while the page was busy); returns its search field."""
    search = page.locator(".lm-CommandPalette-input").first
    page.keyboard.press("Control+Shift+C")
    try:
        search.wait_for(state="visible", timeout=5_000)
        return search
    except PlaywrightError:
        pass
    page.locator(".lm-MenuBar-itemLabel", has_text="View").first.click()
    page.locator(".lm-Menu-item", has_text="Activate Command Palette").first.click()
    search.wait_for(state="visible", timeout=10_000)
    return search


def run_command(page, text: str, expect=None) -> None:
    """Run a command from the palette by its label; with ``expect`` (a locator), until
    that shows up (a palette closed by a focus change is opened again)."""
    for _attempt in range(3):
        search = open_palette(page)
        try:
            search.fill(text, timeout=5_000)
        except PlaywrightError:  # the palette closed again (a late focus change): reopen it
            continue
        # the palette re-renders its items whenever some command changes: retry a click
        # that lands on an item being replaced
        item = page.locator(".lm-CommandPalette-item", has_text=text).first
        for _ in range(10):
            try:
                item.click(timeout=3_000)
                break
            except PlaywrightError:  # detached or covered while re-rendered
                if not search.is_visible():
                    break
        if expect is None:
            return
        try:
            expect.wait_for(state="visible", timeout=5_000)
            return
        except PlaywrightError:
            page.keyboard.press("Escape")
    raise AssertionError(f"running {text!r} from the palette did not show {expect}")


def open_path(page, relative: str) -> None:
    """Open a file of the server root in the current page with "Open from Path…" (no reload);
    return once its tab is the current one."""
    field = page.locator(".jp-Dialog input")
    run_command(page, "Open from Path…", expect=field)
    field.fill(relative)
    field.press("Enter")
    field.wait_for(state="detached", timeout=10_000)
    page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current", has_text=relative.rpartition("/")[2]).wait_for(
        state="visible", timeout=60_000
    )


# --- Run at scale and the Jobs section ------------------------------------------------


def run_at_scale_notebook(root: Path, name: str = "run-at-scale-ranks.ipynb") -> str:
    """A notebook that prints its rank (and shows a figure and its parameter), in the
    server root ``root``; its path there.

    Not examples/02-run-at-scale.ipynb: that one drives the %podman_hpc magics
    (it submits a job of its own), and run at scale each rank would
    `%load_ext jupyter_podman_hpc` inside the base image, which lacks it.
    """
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_markdown_cell("# Run at scale: every rank says who it is"),
        nbformat.v4.new_code_cell("colour = 'red'", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell(RANK_CODE),
        nbformat.v4.new_code_cell(FIGURE_CODE),
    ]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, root / name)
    return name


def shape_job(dialog, image: str, nodes: int, tasks_per_node: int) -> None:
    """In the Run at scale dialog: the image and the job's shape."""
    dialog.locator('select[name="image"]').select_option(image)
    dialog.locator('input[name="nodes"]').fill(str(nodes))
    dialog.locator('input[name="tasks_per_node"]').fill(str(tasks_per_node))


def submit_job(page, dialog):
    """Submit the Run at scale dialog; the job's row, which the Jobs section reveals and
    selects, and the job's id."""
    submit = dialog.locator(".jp-PodmanHpc-submitButton")
    assert submit.is_enabled()
    submit.click()
    dialog.wait_for(state="detached", timeout=60_000)
    panel = page.locator(PANEL)
    panel.wait_for(state="visible", timeout=15_000)
    row = panel.locator(".jp-PodmanHpc-job.jp-mod-selected")
    row.wait_for(state="visible", timeout=30_000)
    job_id = row.get_attribute("data-job-id")
    assert job_id
    return row, job_id


def wait_for_job(page, lab, job_id: str, state: str = "COMPLETED", timeout: float = JOB_TIMEOUT):
    """The job's row in the Jobs section once it shows ``state`` by itself (the section polls);
    the test fails with the job's record and batch log if it does not."""
    row = page.locator(PANEL).locator(f'.jp-PodmanHpc-job[data-job-id="{job_id}"]')
    reached = page.locator(PANEL).locator(f'.jp-PodmanHpc-job[data-job-id="{job_id}"][data-state="{state}"]')
    started = time.monotonic()
    try:
        reached.wait_for(state="visible", timeout=timeout)
    except PlaywrightError:
        shown = row.get_attribute("data-state") if row.count() else "not listed"
        job = get_json(lab, f"podman-hpc/api/jobs/{job_id}")
        logs = get_json(lab, f"podman-hpc/api/jobs/{job_id}/logs")
        pytest.fail(
            f"job {job_id} is {shown}, not {state}:\n{job}\nbatch log:\n{logs['batch']}\nrank errors: {logs['errors']}"
        )
    print(f"job {job_id} {state} {time.monotonic() - started:.1f} s after it was waited for")
    return reached


def check_rank_logs(page, row, job_id: str, ranks: int):
    """Open the finished job's logs viewer from its row: one section per rank, in order, each
    starting with what RANK_CODE prints; the viewer's locator."""
    row.locator(".jp-PodmanHpc-jobLogs").click()
    logs = page.locator(f"#jp-PodmanHpc-logs-{job_id}")
    logs.wait_for(state="visible", timeout=30_000)
    sections = logs.locator(".jp-PodmanHpc-rank")
    deadline = time.monotonic() + 60
    while sections.count() < ranks and time.monotonic() < deadline:
        page.wait_for_timeout(500)
    assert sections.count() == ranks, logs.inner_text()
    assert [sections.nth(i).get_attribute("data-rank") for i in range(ranks)] == [str(i) for i in range(ranks)]
    for rank in range(ranks):
        assert sections.nth(rank).locator(".jp-PodmanHpc-rankOut").inner_text().strip().startswith(f"rank {rank}\n"), (
            logs.inner_text()
        )
    assert logs.locator(".jp-PodmanHpc-state").inner_text() == "COMPLETED"
    return logs
