"""The extension's features in a real browser against JupyterLab on the cluster-in-a-box.

- "Run at scale": a notebook submitted on 4 nodes x 2 tasks with a parameter
  reaches COMPLETED, its logs viewer shows 8 ranks, and "Open output" shows the
  executed notebook with its image and the parameter's value; a form with 0
  nodes cannot be submitted.
- The Containers panel: a pull from the local registry shows progress and the
  image appears squashed; a build from a Containerfile in the file browser
  shows its log and the new image; "Make kernel" puts a kernel in the Launcher.

Screenshots of the dialog, the panel and the logs viewer go to `artifacts`.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from pathlib import Path

import nbformat
import pytest

from jupyter_podman_hpc.kernels.orphans import POOL_LABEL
from tests.browser.lab import (
    JOB_TIMEOUT,
    PANEL,
    RANK_CODE,
    check_rank_logs,
    get_json,
    open_dialog,
    open_lab,
    open_notebook,
    open_panel,
    run_at_scale_notebook,
    run_command,
    shape_job,
    submit_job,
    wait_for_job,
)
from tests.helpers.commands import run
from tests.helpers.hpc import cleanup_hpc, make_hpc

pytestmark = [pytest.mark.browser, pytest.mark.integration]

TASK_TIMEOUT = 240_000  # ms: a pull or build, then its squash


def small_notebook(root: Path, name: str) -> str:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(RANK_CODE)]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, root / name)
    return name


def image_row(panel, name: str):
    return panel.locator(f'.jp-PodmanHpc-image[data-image="{name}"]')


# --- Run at scale -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_run_at_scale_4_nodes_x_2_tasks(page, console, stack_lab, artifacts):
    stack = stack_lab.stack
    name = run_at_scale_notebook(stack_lab.root_dir)
    open_notebook(page, stack_lab, console, name)

    dialog = open_dialog(page)
    shape_job(dialog, stack.base_image, nodes=4, tasks_per_node=2)
    assert "4 nodes \N{MULTIPLICATION SIGN} 2 tasks = 8 ranks" in dialog.locator(".jp-PodmanHpc-summary").inner_text()
    dialog.locator('textarea[name="parameters"]').fill("colour='blue'")

    dialog.locator(".jp-PodmanHpc-previewButton").click()
    script = dialog.locator(".jp-PodmanHpc-script")
    script.wait_for(state="visible", timeout=60_000)
    text = script.inner_text()
    assert "srun " in text and "podman-hpc shared-run" in text, text
    assert "#SBATCH --nodes=4" in text and "#SBATCH --ntasks-per-node=2" in text, text
    assert stack.base_image in text
    page.screenshot(path=str(artifacts / "run-at-scale-dialog.png"))

    # the job is revealed in the Jobs section of the panel, and reaches COMPLETED by itself
    # (the list polls every refreshInterval seconds)
    _, job_id = submit_job(page, dialog)
    completed = wait_for_job(page, stack_lab, job_id)
    assert completed.locator(".jp-PodmanHpc-jobExit").inner_text() == "exit 0"
    assert completed.locator(".jp-PodmanHpc-jobNodes").inner_text().startswith("4 nodes \N{MULTIPLICATION SIGN} 2")
    page.screenshot(path=str(artifacts / "containers-panel-jobs.png"))

    # the logs viewer: one section per rank
    check_rank_logs(page, completed, job_id, ranks=8)
    page.screenshot(path=str(artifacts / "job-logs-viewer.png"))

    # the output notebook, read-only: the image and the parameter given in the dialog
    assert "completed" in completed.locator(".jp-PodmanHpc-jobProgress").inner_text()
    completed.locator(".jp-PodmanHpc-jobOutput").click()
    output = page.locator(f"#jp-PodmanHpc-output-main-{job_id}")
    output.wait_for(state="visible", timeout=30_000)
    image = output.locator(".jp-OutputArea-output img")
    image.wait_for(state="visible", timeout=30_000)
    assert image.get_attribute("src").startswith("data:image/png;base64,")
    assert "colour is blue" in output.locator(".jp-OutputArea").last.inner_text()
    assert "colour = 'blue'" in output.inner_text()  # the injected cell
    assert output.locator(".jp-PodmanHpc-outputStatus").inner_text() == "COMPLETED · completed"
    page.screenshot(path=str(artifacts / "job-output-notebook.png"))

    # the job directory is on the scratch, outside the server root: its path is shown
    completed.locator(".jp-PodmanHpc-jobDirectory").click()
    path = page.locator(".jp-Dialog .jp-PodmanHpc-directoryPath")
    path.wait_for(state="visible", timeout=15_000)
    directory = path.inner_text()
    assert directory.startswith(str(stack_lab.job_root) + "/") and (Path(directory) / "job.sh").is_file()
    page.locator(".jp-Dialog button", has_text="Close").click()
    path.wait_for(state="detached", timeout=10_000)
    assert console.errors == [], f"console errors:\n{console}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_running_notebook_job_shows_its_cell_and_its_output_notebook_fills_in(page, console, stack_lab, artifacts):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("print('first cell')"),
        nbformat.v4.new_code_cell("import time\nprint('second cell waits', flush=True)\ntime.sleep(25)"),
        nbformat.v4.new_code_cell("print('third cell')"),
    ]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    name = f"live-{uuid.uuid4().hex[:6]}.ipynb"
    nbformat.write(notebook, stack_lab.root_dir / name)
    open_notebook(page, stack_lab, console, name)
    dialog = open_dialog(page)
    shape_job(dialog, stack_lab.stack.base_image, nodes=1, tasks_per_node=1)
    row, job_id = submit_job(page, dialog)
    # while it runs: the panel says which cell rank 0 is in, and the output notebook has what it did so far
    progress = row.locator(".jp-PodmanHpc-jobProgress", has_text="running cell 2 of 3")
    progress.wait_for(state="visible", timeout=JOB_TIMEOUT)
    row.locator(".jp-PodmanHpc-jobOutput").click()
    output = page.locator(f"#jp-PodmanHpc-output-main-{job_id}")
    output.locator(".jp-OutputArea", has_text="second cell waits").wait_for(state="visible", timeout=30_000)
    assert "running cell 2 of 3" in output.locator(".jp-PodmanHpc-outputStatus").inner_text()
    assert output.locator(".jp-OutputArea", has_text="third cell").count() == 0
    assert output.locator(".jp-OutputArea", has_text="had not finished it").count() == 1  # the running cell's note
    page.screenshot(path=str(artifacts / "job-output-running.png"))
    # it fills in by itself as the job goes on
    output.locator(".jp-OutputArea", has_text="third cell").wait_for(state="visible", timeout=120_000)
    output.locator(".jp-PodmanHpc-outputStatus", has_text="COMPLETED").wait_for(state="visible", timeout=60_000)
    assert console.errors == [], f"console errors:\n{console}"


def test_a_form_with_0_nodes_cannot_be_submitted(page, console, stack_lab, artifacts):
    name = small_notebook(stack_lab.root_dir, f"form-{uuid.uuid4().hex[:6]}.ipynb")
    posts = []  # POST jobs (preview or submit): none may be sent

    def record(request):
        if request.method == "POST" and "/podman-hpc/api/jobs" in request.url:
            posts.append(request.url)

    page.on("request", record)
    open_notebook(page, stack_lab, console, name)
    # this time from the notebook's context menu
    page.locator(".jp-NotebookPanel:visible .jp-Cell").first.click(button="right")
    page.locator(".lm-Menu-item", has_text="Run at Scale…").click()
    dialog = page.locator(".jp-PodmanHpc-runDialog")
    dialog.wait_for(state="visible", timeout=30_000)
    dialog.locator('select[name="image"]').select_option(stack_lab.stack.base_image)
    submit = dialog.locator(".jp-PodmanHpc-submitButton")
    assert submit.is_enabled()

    nodes = dialog.locator('input[name="nodes"]')
    nodes.fill("0")
    error = dialog.locator('.jp-PodmanHpc-field[data-field="nodes"] .jp-PodmanHpc-fieldError')
    error.wait_for(state="visible", timeout=5_000)
    assert "Nodes must be between 1 and" in error.inner_text()
    assert nodes.get_attribute("aria-invalid") == "true"
    assert submit.is_disabled()
    page.screenshot(path=str(artifacts / "run-at-scale-invalid.png"))
    # neither Enter nor Preview sends it
    nodes.press("Enter")
    dialog.locator(".jp-PodmanHpc-previewButton").click()
    page.wait_for_timeout(500)
    assert dialog.is_visible()
    assert posts == []

    # a malformed time limit and too many tasks are flagged too; a fixed form is accepted again
    nodes.fill("2")
    assert submit.is_enabled()
    dialog.locator('input[name="time"]').fill("1:75:00")
    assert submit.is_disabled()
    assert "Not a Slurm time limit" in dialog.locator('.jp-PodmanHpc-field[data-field="time"]').inner_text()
    dialog.locator('input[name="time"]').fill("00:05:00")
    limits = get_json(stack_lab, "podman-hpc/api/config")["limits"]
    dialog.locator('input[name="tasks_per_node"]').fill(str(limits["max_tasks_per_node"] + 1))
    assert submit.is_disabled()
    dialog.locator('input[name="tasks_per_node"]').fill("1")
    assert submit.is_enabled()

    # a module conflicting with a checked one is disabled
    modules = {m["name"]: m for m in get_json(stack_lab, "podman-hpc/api/config")["modules"]}
    conflicting = next((m for m in modules.values() if m["conflicts"]), None)
    if conflicting:
        dialog.locator(f'.jp-PodmanHpc-module[data-module="{conflicting["name"]}"] input').check()
        other = conflicting["conflicts"][0]
        assert dialog.locator(f'.jp-PodmanHpc-module[data-module="{other}"] input').is_disabled()
        dialog.locator(f'.jp-PodmanHpc-module[data-module="{conflicting["name"]}"] input').uncheck()
        assert dialog.locator(f'.jp-PodmanHpc-module[data-module="{other}"] input').is_enabled()

    dialog.locator(".jp-mod-reject").first.click()
    dialog.wait_for(state="detached", timeout=10_000)
    # the palette has the command too; Escape closes the dialog
    run_command(page, "Run Notebook at Scale…", expect=dialog)
    page.keyboard.press("Escape")
    dialog.wait_for(state="detached", timeout=10_000)
    assert posts == []
    assert console.errors == [], f"console errors:\n{console}"


def put_settings(lab, values: dict) -> None:
    """Set the user's settings of the extension (the page must be loaded afterwards)."""
    body = json.dumps({"raw": json.dumps(values)}).encode()
    request = urllib.request.Request(
        f"{lab.url}lab/api/settings/jupyter-podman-hpc:plugin",
        data=body,
        method="PUT",
        headers={"Authorization": f"token {lab.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30):
        pass


def test_settings_are_the_defaults_and_server_errors_are_shown(page, console, stack_lab, artifacts):
    """User settings prefill the form; what only Slurm refuses comes back as a message in the dialog."""
    put_settings(stack_lab, {"nodes": 2, "tasksPerNode": 3, "time": "00:07:00", "partition": "nosuchpartition"})
    try:
        name = small_notebook(stack_lab.root_dir, f"errors-{uuid.uuid4().hex[:6]}.ipynb")
        open_notebook(page, stack_lab, console, name)
        dialog = open_dialog(page)
        assert dialog.locator('input[name="nodes"]').input_value() == "2"
        assert dialog.locator('input[name="tasks_per_node"]').input_value() == "3"
        assert dialog.locator('input[name="time"]').input_value() == "00:07:00"
        assert dialog.locator('select[name="partition"]').input_value() == "nosuchpartition"
        dialog.locator('select[name="image"]').select_option(stack_lab.stack.base_image)
        dialog.locator(".jp-PodmanHpc-submitButton").click()
        error = dialog.locator(".jp-PodmanHpc-serverError")
        error.wait_for(state="visible", timeout=60_000)
        assert "partition" in error.inner_text().lower(), error.inner_text()
        page.screenshot(path=str(artifacts / "run-at-scale-server-error.png"))
        assert dialog.is_visible()  # still open: correct the value and submit again
        assert dialog.locator(".jp-PodmanHpc-submitButton").is_enabled()
        dialog.locator(".jp-mod-reject").first.click()
    finally:
        put_settings(stack_lab, {})
    # the only console errors are the browser's report of the refused request
    unexpected = [e for e in console.errors if "status of 400" not in e]
    assert unexpected == [], f"console errors:\n{console}"


# --- the Containers panel ---------------------------------------------------------------


@pytest.fixture
def pushed_image(stack):
    """A small image built from the tiny one, pushed to the local registry under a unique tag."""
    builder = make_hpc(stack, "browser-push")
    remote = f"{stack.registry}/jph/browser-pull-{uuid.uuid4().hex[:8]}:1"
    try:
        context = builder.work / "context"
        context.mkdir()
        (context / "Containerfile").write_text(f"FROM {stack.tiny_image}\nRUN echo {uuid.uuid4().hex} > /id\n")
        builder("build", "--tls-verify=false", "-t", "localhost/tests/browser-pull:1", context)
        builder("push", "--tls-verify=false", "localhost/tests/browser-pull:1", remote)
        yield remote
    finally:
        run(["skopeo", "delete", "--tls-verify=false", f"docker://{remote}"], check=False)
        cleanup_hpc(builder)


@pytest.mark.slow
def test_pull_shows_progress_and_the_image_appears_squashed(page, console, stack_lab, pushed_image, artifacts):
    streams = []  # the progress comes from the task's event stream (server-sent events)
    page.on("request", lambda request: streams.append(request.url) if request.resource_type == "eventsource" else None)
    open_lab(page, stack_lab, console)
    panel = open_panel(page)
    panel.locator(".jp-PodmanHpc-imageList").wait_for(state="attached", timeout=30_000)
    page.wait_for_function(
        "() => !document.querySelector('#jp-PodmanHpc-images .jp-PodmanHpc-status')?.textContent.includes('Loading')",
        timeout=60_000,
    )
    panel.locator(".jp-PodmanHpc-pullInput").fill(pushed_image)
    panel.locator(".jp-PodmanHpc-pullButton").click()

    task = panel.locator('.jp-PodmanHpc-task[data-kind="pull"]').first
    task.wait_for(state="visible", timeout=30_000)
    assert pushed_image in task.locator(".jp-PodmanHpc-taskTitle").inner_text()
    # progress: per-layer bars while it downloads, then the squash stage
    task.locator(".jp-PodmanHpc-layer").first.wait_for(state="attached", timeout=TASK_TIMEOUT)
    task.locator('.jp-PodmanHpc-stage[data-stage="squash"]').wait_for(state="attached", timeout=TASK_TIMEOUT)
    page.locator(
        f'.jp-PodmanHpc-task[data-task-id="{task.get_attribute("data-task-id")}"][data-state="succeeded"]'
    ).wait_for(state="visible", timeout=TASK_TIMEOUT)
    layers = task.locator(".jp-PodmanHpc-layer")
    assert layers.count() >= 1
    for i in range(layers.count()):
        assert layers.nth(i).locator(".jp-PodmanHpc-bar").get_attribute("aria-valuenow") == "100"
    assert (
        task.locator('.jp-PodmanHpc-stage[data-stage="squash"] .jp-PodmanHpc-bar').get_attribute("aria-valuenow")
        == "100"
    )

    assert any("/podman-hpc/api/tasks/" in url and "/events" in url for url in streams), (
        f"the panel did not follow the pull through GET tasks/{{id}}/events: {streams}"
    )
    row = image_row(panel, pushed_image)
    row.wait_for(state="visible", timeout=60_000)
    assert row.get_attribute("data-squashed") == "true"
    assert row.locator(".jp-PodmanHpc-squashedBadge").is_visible()
    assert "squashed" in row.locator(".jp-PodmanHpc-imageMeta").inner_text()
    page.screenshot(path=str(artifacts / "containers-panel-pull.png"))

    # remove it from the squashed store (it stays local), then squash it again
    row.locator(".jp-PodmanHpc-removeSquashed").click()
    page.locator(".jp-Dialog .jp-mod-warn").click()
    image_row(panel, pushed_image).and_(panel.locator('[data-squashed="false"]')).wait_for(timeout=60_000)
    assert not row.locator(".jp-PodmanHpc-squashedBadge").is_visible()
    row.locator(".jp-PodmanHpc-squashImage").click()
    squash = panel.locator('.jp-PodmanHpc-task[data-kind="squash"]').first
    squash.wait_for(state="visible", timeout=30_000)
    panel.locator(
        f'.jp-PodmanHpc-task[data-task-id="{squash.get_attribute("data-task-id")}"][data-state="succeeded"]'
    ).wait_for(state="visible", timeout=TASK_TIMEOUT)
    image_row(panel, pushed_image).and_(panel.locator('[data-squashed="true"]')).wait_for(timeout=60_000)
    assert console.errors == [], f"console errors:\n{console}"


@pytest.mark.slow
def test_build_from_a_containerfile_in_the_file_browser(page, console, stack_lab, artifacts):
    stack = stack_lab.stack
    folder = stack_lab.root_dir / f"build-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    (folder / "Containerfile").write_text(
        f"FROM {stack.tiny_image}\nLABEL org.jupyter-podman-hpc.test={uuid.uuid4().hex}\nRUN echo built > /built\n"
    )
    tag = f"localhost/jph-browser-build-{uuid.uuid4().hex[:8]}:latest"

    open_lab(page, stack_lab, console, f"lab/tree/{folder.name}")
    item = page.locator('.jp-DirListing-item[data-file-type="podman-hpc-containerfile"]', has_text="Containerfile")
    item.wait_for(state="visible", timeout=30_000)
    item.click(button="right")
    page.locator(".lm-Menu-item", has_text="Build Image…").click()
    dialog = page.locator(".jp-PodmanHpc-buildDialog")
    dialog.wait_for(state="visible", timeout=15_000)
    assert dialog.locator('input[name="path"]').input_value() == f"{folder.name}/Containerfile"
    dialog.locator('input[name="tag"]').fill(tag)
    dialog.locator(".jp-PodmanHpc-buildButton").click()
    dialog.wait_for(state="detached", timeout=15_000)

    panel = page.locator(PANEL)
    panel.wait_for(state="visible", timeout=15_000)
    task = panel.locator('.jp-PodmanHpc-task[data-kind="build"]').first
    task.wait_for(state="visible", timeout=30_000)
    log = task.locator(".jp-PodmanHpc-log")
    page.wait_for_function(
        "node => node.textContent.includes('STEP 3/3')", arg=log.element_handle(), timeout=TASK_TIMEOUT
    )
    task_id = task.get_attribute("data-task-id")
    page.locator(f'.jp-PodmanHpc-task[data-task-id="{task_id}"][data-state="succeeded"]').wait_for(
        state="visible", timeout=TASK_TIMEOUT
    )
    text = log.inner_text()
    assert "STEP 1/3: FROM" in text and "STEP 3/3: RUN echo built" in text, text
    assert (
        task.locator('.jp-PodmanHpc-stage[data-stage="build"] .jp-PodmanHpc-bar').get_attribute("aria-valuenow")
        == "100"
    )

    row = image_row(panel, tag)
    row.wait_for(state="visible", timeout=60_000)
    assert row.get_attribute("data-squashed") == "true"  # squashed afterwards (the dialog's default)
    page.screenshot(path=str(artifacts / "containers-panel-build.png"))
    assert console.errors == [], f"console errors:\n{console}"


def test_make_kernel_appears_in_the_launcher(page, console, stack_lab, artifacts):
    stack = stack_lab.stack
    display = f"Base {uuid.uuid4().hex[:6]} (podman-hpc)"
    open_lab(page, stack_lab, console)
    panel = open_panel(page)
    row = image_row(panel, stack.base_image)
    row.wait_for(state="visible", timeout=60_000)
    row.locator(".jp-PodmanHpc-makeKernel").click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(state="visible", timeout=15_000)
    dialog.locator("input[name=display_name]").fill(display)
    # "Kept ready" left empty: the server's default pool (one kernel)
    assert dialog.locator("input[name=pool]").input_value() == ""
    page.screenshot(path=str(artifacts / "make-kernel-dialog.png"))
    dialog.locator(".jp-mod-accept").click()
    # installed: a notification says so (an error would open a dialog instead)
    page.locator(".Toastify__toast", has_text="installed").first.wait_for(state="visible", timeout=60_000)
    kernels = get_json(stack_lab, "podman-hpc/api/kernels")["kernels"]
    [kernel] = [k for k in kernels if k["display_name"] == display]
    assert kernel["image"] == stack.base_image and kernel["pool"] is None, kernel
    try:
        # the server keeps one of its kernels started (c.PodmanHPC.kernel_pool's default)
        deadline = time.monotonic() + 60
        while not pool_containers(stack_lab, kernel["name"]):
            assert time.monotonic() < deadline, f"no pool container for {kernel['name']}"
            time.sleep(0.5)
        # the Launcher lists it without a reload
        page.keyboard.press("Control+Shift+L")
        card = page.locator(".jp-LauncherCard:visible", has_text=display)
        card.first.wait_for(state="visible", timeout=30_000)
        page.screenshot(path=str(artifacts / "launcher-container-kernel.png"))
        assert console.errors == [], f"console errors:\n{console}"
    finally:  # removing the kernelspec closes its pool
        removal = urllib.request.Request(
            f"{stack_lab.url}podman-hpc/api/kernels/{kernel['name']}",
            method="DELETE",
            headers={"Authorization": f"token {stack_lab.token}"},
        )
        urllib.request.urlopen(removal, timeout=60).close()
        deadline = time.monotonic() + 30
        while pool_containers(stack_lab, kernel["name"]):
            assert time.monotonic() < deadline, f"the pool of {kernel['name']} outlived its kernelspec"
            time.sleep(0.5)


def pool_containers(stack_lab, kernel_name: str) -> list[str]:
    out = stack_lab.hpc("ps", "--all", "--filter", f"label={POOL_LABEL}={kernel_name}", "--format", "{{.Names}}").stdout
    return out.split()
