"""A user of the site's JupyterHub in a real browser (docs/site.md): log in, pick the
compute-node profile, and on the server the Slurm job runs on a node (from the site
environment, the installed wheel) the Launcher lists the container kernels; one starts
and runs a cell; `%podman_hpc run` works from a notebook; "Stop My Server" on the
hub's control panel cancels the job and leaves no container on the node.

The time from "Start" on the spawn page to the container kernel's first output is
written to tests/artifacts/hub-start-times.json (browser_node_start_to_output_s).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.kernels.conftest import http
from tests.integration.site.conftest import site_venv  # noqa: F401 (fixture)
from tests.integration.site.hub import install_kernel, server_jobs, start_hub, stop_hub, timings_note

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.integration]

TIMINGS = Path(__file__).resolve().parents[1] / "artifacts" / "hub-start-times.json"
DISPLAY = "Base image (site, node)"
NOTEBOOK = ".jp-NotebookPanel:visible"


@pytest.fixture
def hub(stack, squashed_base, site_venv, configurable_http_proxy):  # noqa: F811
    instance = start_hub(stack=stack, squashed=squashed_base, site_venv=site_venv, chp=configurable_http_proxy)
    install_kernel(instance, site_venv, stack.base_image, "site-node", DISPLAY)
    try:
        yield instance
    finally:
        stop_hub(instance)
        timings_note(instance, TIMINGS)


def _run_cell(page, code: str, expect: str, timeout: float = 180_000):
    """Type ``code`` into the current notebook's last cell, run it, wait for ``expect`` in its output."""
    editor = page.locator(f"{NOTEBOOK} .jp-Cell").last.locator(".cm-content")
    editor.click()
    page.keyboard.type(code)
    page.keyboard.press("Shift+Enter")
    output = page.locator(f"{NOTEBOOK} .jp-OutputArea-output", has_text=expect)
    output.first.wait_for(state="visible", timeout=timeout)
    return output.first.inner_text()


def _open_from_launcher(page, hub, label: str, timeout: float = 180) -> None:
    """Open a notebook from the Launcher card ``label``; return once its kernel is connected
    and idle (a cell run before that is lost)."""
    known = {kernel["id"] for kernel in _kernels(hub)}
    page.keyboard.press("Escape")  # out of a cell editor, which takes Ctrl+Shift+L for itself
    page.keyboard.press("Control+Shift+L")
    card = page.locator(".jp-LauncherCard:visible", has_text=label)
    card.first.wait_for(state="visible", timeout=60_000)
    card.first.click()
    page.locator(f"{NOTEBOOK} .jp-Cell").first.wait_for(state="visible", timeout=60_000)
    deadline = time.monotonic() + timeout
    while not [kernel for kernel in _kernels(hub) if kernel["id"] not in known
               and kernel["connections"] > 0 and kernel["execution_state"] == "idle"]:
        assert time.monotonic() < deadline, f"no connected kernel of {label}: {_kernels(hub)}"
        time.sleep(0.5)
    page.wait_for_timeout(1000)  # the page's own kernel-ready handshake


def _kernels(hub) -> list[dict]:
    status, kernels = http("GET", f"{hub.url}/user/{hub.user}/api/kernels", hub.token)
    assert status == 200, kernels
    return kernels


def _node_containers(hpc, node: str) -> list[str]:
    out = hpc.srun("--immediate=60", "-N1", "-n1", "-w", node, "podman-hpc", "ps", "--all",
                   "--format", "{{.Names}}").stdout
    return [name for name in out.split() if name.startswith("podman-hpc-")]


def test_server_on_a_node_from_the_browser(hub, page, console, artifacts, stack, squashed_base):
    page.set_default_timeout(60_000)
    page.goto(f"{hub.url}/hub/login", wait_until="domcontentloaded")
    page.fill("#username_input", hub.user)
    page.fill("#password_input", hub.password)
    page.click("#login_submit")
    # the profiles: compute node or login node
    page.wait_for_selector("select[name=profile]")
    page.select_option("select[name=profile]", "node")
    page.screenshot(path=str(artifacts / "hub-spawn-profiles.png"))
    started = time.monotonic()
    page.click("#spawn_form [type=submit]")
    page.wait_for_url(f"**/user/{hub.user}/lab**", timeout=300_000)
    page.wait_for_selector("#jupyterlab-splash", state="detached")
    jobs = server_jobs(hub.user)
    assert len(jobs) == 1 and jobs[0][1] == "RUNNING" and jobs[0][2] in stack.nodes, jobs
    job_id, _, node = jobs[0]

    # the Launcher lists the container kernel; it starts on the node and runs a cell
    _open_from_launcher(page, hub, DISPLAY)
    out = _run_cell(page, "print(open('/etc/os-release').read())", "VERSION_CODENAME=bookworm")
    hub.timings["browser_node_start_to_output_s"] = round(time.monotonic() - started, 2)
    assert "bookworm" in out
    assert [name for name in _node_containers_in_job(squashed_base, node, job_id)
            if name.startswith("podman-hpc-kernel-")], "no kernel container on the server's node"
    page.screenshot(path=str(artifacts / "hub-node-container-kernel.png"))

    # the magics, from the site environment's Python kernel on the node
    _open_from_launcher(page, hub, "Python 3 (ipykernel)")
    out = _run_cell(page, "%load_ext jupyter_podman_hpc\n"
                    f"%podman_hpc run --rm {stack.base_image} sh -c 'echo from-$(cat /etc/debian_version)'",
                    "from-12")
    assert "from-12" in out, out
    page.screenshot(path=str(artifacts / "hub-node-magic-run.png"))

    # Stop My Server on the control panel: the job goes, and every container with it
    page.goto(f"{hub.url}/hub/home", wait_until="domcontentloaded")
    page.click("#stop")
    page.wait_for_selector("#start", state="visible", timeout=120_000)
    deadline = time.monotonic() + 60
    while server_jobs(hub.user):
        assert time.monotonic() < deadline, f"the server's job outlived Stop My Server: {server_jobs(hub.user)}"
        time.sleep(1)
    deadline = time.monotonic() + 30
    while (left := _node_containers(squashed_base, node)) and time.monotonic() < deadline:
        time.sleep(2)
    assert left == [], left
    page.screenshot(path=str(artifacts / "hub-node-stopped.png"))


def _node_containers_in_job(hpc, node: str, job_id: str) -> list[str]:
    out = hpc.srun("--jobid", job_id, "--overlap", "-N1", "-n1", "-w", node, "podman-hpc", "ps", "--all",
                   "--format", "{{.Names}}").stdout
    return out.split()
