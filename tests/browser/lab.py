"""Helpers for driving JupyterLab and the extension in the browser tests."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request

ACTIVATED = "jupyter-podman-hpc is activated"
PANEL = "#jp-PodmanHpc-panel"
RUN_BUTTON = ".jp-NotebookPanel .jp-PodmanHpc-runAtScaleButton:visible"  # the current notebook's


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
    except Exception:
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
    except Exception:
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
        search.fill(text)
        # the palette re-renders its items whenever some command changes: retry a click
        # that lands on an item being replaced
        item = page.locator(".lm-CommandPalette-item", has_text=text).first
        for _ in range(10):
            try:
                item.click(timeout=3_000)
                break
            except Exception:  # detached or covered while re-rendered
                if not search.is_visible():
                    break
        if expect is None:
            return
        try:
            expect.wait_for(state="visible", timeout=5_000)
            return
        except Exception:
            page.keyboard.press("Escape")
    raise AssertionError(f"running {text!r} from the palette did not show {expect}")
