"""The JupyterLab extension is installed, loads in a real browser and registers its parts."""

import json
import time
import urllib.request

import pytest

pytestmark = pytest.mark.browser

ACTIVATED = "jupyter-podman-hpc is activated"
PLUGIN_ID = "jupyter-podman-hpc:plugin"


def _get_json(jupyterlab, path: str):
    request = urllib.request.Request(
        f"{jupyterlab.url}{path}", headers={"Authorization": f"token {jupyterlab.token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def _open_lab(page, jupyterlab, console) -> None:
    """Open JupyterLab and wait until it has restored its layout and our plugin has run."""
    page.goto(jupyterlab.lab_url(), wait_until="domcontentloaded", timeout=60_000)
    page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
    # The splash screen goes when the application has restored its layout.
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)
    deadline = time.monotonic() + 30
    while ACTIVATED not in console.texts("log") and time.monotonic() < deadline:
        page.wait_for_timeout(250)


def test_server_serves_the_extension_and_its_settings(jupyterlab):
    settings = _get_json(jupyterlab, f"lab/api/settings/{PLUGIN_ID}")
    defaults = {name: prop["default"] for name, prop in settings["schema"]["properties"].items()}
    assert defaults == {
        "nodes": 1,
        "tasksPerNode": 1,
        "time": "00:10:00",
        "partition": "",
        "refreshInterval": 5,
    }


def test_extension_activates_without_console_errors(page, console, jupyterlab):
    _open_lab(page, jupyterlab, console)
    assert ACTIVATED in console.texts("log"), f"the plugin did not activate; console:\n{console}"
    assert console.errors == [], f"console errors:\n{console}\nserver log:\n{jupyterlab.log_tail()}"


def test_about_command_is_in_the_palette_and_opens_a_dialog(page, console, jupyterlab):
    _open_lab(page, jupyterlab, console)
    page.keyboard.press("Control+Shift+C")  # the command palette
    search = page.locator(".lm-CommandPalette-input, .jp-mod-commandPalette input").first
    search.wait_for(timeout=15_000)
    search.fill("About podman-hpc")
    item = page.locator(".lm-CommandPalette-item", has_text="About podman-hpc").first
    item.wait_for(timeout=15_000)
    item.click()
    dialog = page.locator(".jp-Dialog .jp-PodmanHpc-about")
    dialog.wait_for(timeout=15_000)
    assert "Tasks per node" in dialog.inner_text()
    assert console.errors == [], f"console errors:\n{console}"
