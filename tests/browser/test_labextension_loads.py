"""The JupyterLab extension is installed, loads in a real browser and registers its parts."""

import pytest

from tests.browser.lab import ACTIVATED, get_json, open_lab, run_command

pytestmark = pytest.mark.browser

PLUGIN_ID = "jupyter-podman-hpc:plugin"


def test_server_serves_the_extension_and_its_settings(jupyterlab):
    settings = get_json(jupyterlab, f"lab/api/settings/{PLUGIN_ID}")
    defaults = {name: prop["default"] for name, prop in settings["schema"]["properties"].items()}
    assert defaults == {
        "nodes": 1,
        "tasksPerNode": 1,
        "time": "00:10:00",
        "partition": "",
        "account": "",
        "refreshInterval": 5,
    }


def test_extension_activates_without_console_errors(page, console, jupyterlab):
    open_lab(page, jupyterlab, console)
    assert ACTIVATED in console.texts("log"), f"the plugin did not activate; console:\n{console}"
    assert console.errors == [], f"console errors:\n{console}\nserver log:\n{jupyterlab.log_tail()}"


def test_about_command_is_in_the_palette_and_opens_a_dialog(page, console, jupyterlab):
    open_lab(page, jupyterlab, console)
    dialog = page.locator(".jp-Dialog .jp-PodmanHpc-about")
    run_command(page, "About podman-hpc", expect=dialog)
    assert "Tasks per node" in dialog.inner_text()
    assert console.errors == [], f"console errors:\n{console}"
