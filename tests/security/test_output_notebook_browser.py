"""Attack: image code rewrites a notebook job's output notebook so that it scripts the user's
JupyterLab when the user clicks "Open output" in the Jobs panel (issue 38).

The container writes the output notebook, so code in the image can leave any JSON there: here,
every cell marked ``metadata.trusted`` and one more cell whose HTML has a ``<script>`` and an
``onerror`` handler, a JavaScript output, and a PNG. JupyterLab renders a trusted cell's HTML
unsanitised and runs its scripts; the output view must show every cell untrusted. Each script
would set a marker on ``window``: none may be set, while the notebook's own figure, the planted
PNG and the planted HTML's text (sanitised) still show.

It is opened twice, in a real chromium against a real JupyterLab and a real Slurm job: once as
the user meets it (the server, then the Lab), and once with the server's answer carrying the
notebook exactly as the container wrote it, so that the Lab's own defence is what is tested
(whatever the server strips).
"""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import pytest

from tests.browser.lab import (
    PNG_B64,
    get_json,
    open_dialog,
    open_lab,
    open_notebook,
    open_panel,
    run_at_scale_notebook,
    shape_job,
    submit_job,
    wait_for_job,
)
from tests.helpers.browser import ConsoleLog

pytestmark = [pytest.mark.browser, pytest.mark.integration]

MARKERS = ("__H1", "__H2", "__H3")
PLANTED_TEXT = "planted by the image"
PLANTED_HTML = f'<p>{PLANTED_TEXT}</p><script>window.__H1 = 1</script><img src="x" onerror="window.__H2 = 1">'
PLANTED_CELL = {
    "cell_type": "code",
    "execution_count": 99,
    "id": "planted",
    "metadata": {"trusted": True},
    "source": "# written by the image after the run",
    "outputs": [
        {"output_type": "display_data", "metadata": {}, "data": {"text/html": PLANTED_HTML, "text/plain": "html"}},
        {
            "output_type": "display_data",
            "metadata": {},
            "data": {"application/javascript": "window.__H3 = 1", "text/plain": "javascript"},
        },
        {
            "output_type": "display_data",
            "metadata": {},
            "data": {"image/png": PNG_B64, "text/plain": "<planted image>"},
        },
    ],
}

# In the page: once every image of the view that is not inline data has loaded or failed (an
# onerror handler runs as it fails), the markers the planted scripts would have set.
READ_MARKERS = """async (view, names) => {
  const fetched = [...view.querySelectorAll('img')].filter(img => !img.src.startsWith('data:'));
  await Promise.all(fetched.map(img => img.complete ? null : new Promise(done => {
    img.addEventListener('error', done);
    img.addEventListener('load', done);
  })));
  return Object.fromEntries(names.map(name => [name, window[name] ?? null]));
}"""


def plant(path: Path) -> None:
    """What image code can do to the output notebook it wrote: every cell trusted, one more
    cell with script in its outputs."""
    notebook = json.loads(path.read_text())
    for cell in notebook["cells"]:
        cell.setdefault("metadata", {})["trusted"] = True
    notebook["cells"].append(PLANTED_CELL)
    path.write_text(json.dumps(notebook))


def open_output(page, job_id: str):
    """Click "Open output" on the job's row in the Jobs section; the view once the planted cell
    and both PNGs have rendered."""
    open_panel(page).locator(f'.jp-PodmanHpc-job[data-job-id="{job_id}"] .jp-PodmanHpc-jobOutput').click()
    view = page.locator(f"#jp-PodmanHpc-output-main-{job_id}")
    view.locator(".jp-OutputArea-output", has_text=PLANTED_TEXT).wait_for(state="visible", timeout=60_000)
    pngs = view.locator('.jp-OutputArea-output img[src^="data:image/png;base64,"]')
    pngs.nth(1).wait_for(state="visible", timeout=30_000)
    assert pngs.count() == 2  # the notebook's own figure and the planted one
    return view


def check_harmless(view) -> None:
    assert view.evaluate(READ_MARKERS, list(MARKERS)) == dict.fromkeys(MARKERS)
    assert view.locator(".jp-Cell.jp-CodeCell").count() == 4  # parameters, rank, figure, planted
    assert "colour is red" in view.inner_text()  # the normal flow: the job's own outputs


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_output_notebook_rewritten_by_the_image_runs_no_script_in_the_lab(page, console, stack_lab, artifacts):
    name = run_at_scale_notebook(stack_lab.root_dir, "trusted-output.ipynb")
    open_notebook(page, stack_lab, console, name)
    dialog = open_dialog(page)
    shape_job(dialog, stack_lab.stack.base_image, nodes=1, tasks_per_node=1)
    _, job_id = submit_job(page, dialog)
    wait_for_job(page, stack_lab, job_id)

    # the attack, once the job (and its finish step) is over: the file the server serves as
    # the output notebook, rewritten as the test's user, whom the container runs as
    path = Path(get_json(stack_lab, f"podman-hpc/api/jobs/{job_id}")["output"]["path"])
    plant(path)

    view = open_output(page, job_id)
    check_harmless(view)
    page.screenshot(path=str(artifacts / "output-notebook-planted.png"))

    # the Lab alone: its answer carries the notebook as the container wrote it, trust and all
    served: list[str] = []

    def as_written(route):
        response = route.fetch()
        body = response.json()
        body["content"] = json.loads(path.read_text())
        served.append(route.request.url)
        route.fulfill(response=response, json=body)

    lab_only = page.context.new_page()
    lab_only_console = ConsoleLog()
    lab_only.on("console", lambda message: lab_only_console.messages.append((message.type, message.text)))
    # (the Lab adds a cache-busting query to the URL)
    lab_only.route(
        lambda url: urllib.parse.urlsplit(url).path.endswith(f"/podman-hpc/api/jobs/{job_id}/output"), as_written
    )
    open_lab(lab_only, stack_lab, lab_only_console)
    view = open_output(lab_only, job_id)
    assert served, "the output notebook was not fetched through the route"
    check_harmless(view)
    lab_only.screenshot(path=str(artifacts / "output-notebook-planted-lab-only.png"))
    lab_only.close()
