"""Many at once, on the real stack: eight notebooks' kernels starting at the same moment from one
Jupyter server (cold, then from a warm pool of eight), and four migrations of different images into
one project store at the same moment by its two members. Everything succeeds; the store holds
exactly the four records and no partial file; no kernel or pool container outlives the server.

The ready times (POST /api/sessions to a cell's output) are printed (pytest -rP) for the note."""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers.attacks import in_store
from tests.helpers.pools import install, open_notebook, pool_containers, wait_for
from tests.helpers.servers import http, jupyter_server, run_cell

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.slow]

NOTEBOOKS = 8


def start_all(base: str, token: str, kernel_name: str) -> list[tuple[str, float]]:
    """Open NOTEBOOKS notebooks on ``kernel_name`` at once and run a cell in each: (kernel id, seconds)."""

    def one(index: int) -> tuple[str, float]:
        started = time.monotonic()
        kernel_id = open_notebook(base, token, f"{kernel_name}-{index}.ipynb", kernel_name)
        assert run_cell(base, token, kernel_id, f"print({index} * 7)") == f"{index * 7}\n"
        return kernel_id, time.monotonic() - started

    with ThreadPoolExecutor(NOTEBOOKS) as pool:
        return list(pool.map(one, range(NOTEBOOKS)))


def report(what: str, started: list[tuple[str, float]]) -> None:
    seconds = sorted(s for _, s in started)
    print(
        f"{what}: {NOTEBOOKS} at once, ready in median {statistics.median(seconds):.2f} s, "
        f"max {seconds[-1]:.2f} s ({', '.join(f'{s:.2f}' for s in seconds)})"
    )


def test_eight_notebooks_start_their_kernels_at_once_cold_and_pooled(kernel_site, stack, tmp_path):
    install(kernel_site, stack, "many-cold", 0)
    install(kernel_site, stack, "many-pooled", NOTEBOOKS)
    root = tmp_path / "notebooks"
    root.mkdir()
    with jupyter_server(kernel_site, root, tmp_path / "server.log") as (base, token, _):
        cold = start_all(base, token, "many-cold")
        report("cold container kernels", cold)
        wait_for(
            f"a pool of {NOTEBOOKS}",
            lambda: len(pool_containers(kernel_site, "many-pooled")) == NOTEBOOKS,
            180,
            interval=1,
        )
        pooled = start_all(base, token, "many-pooled")
        report("pooled container kernels", pooled)
        assert len({kernel_id for kernel_id, _ in cold + pooled}) == 2 * NOTEBOOKS
        for kernel_id, _ in cold + pooled:
            assert http("DELETE", f"{base}/api/kernels/{kernel_id}", token)[0] == 204
    assert kernel_site.containers() == []  # the server stopped: no kernel, no pool container


def test_two_members_migrating_four_images_into_one_project_store_at_once(victim, member, project_store, stack):
    tag = uuid.uuid4().hex[:6]
    # a build context the other member can read too
    context = Path(tempfile.mkdtemp(prefix="jph-many-", dir="/tmp"))
    context.chmod(0o755)
    jobs = []
    try:
        for who, name in ((victim, "a"), (victim, "b"), (member, "c"), (member, "d")):
            (context / "Containerfile").write_text(f"FROM {stack.tiny_image}\nRUN echo {name} > /name\n")
            (context / "Containerfile").chmod(0o644)
            image = f"localhost/many/{name}-{tag}:1"
            who("build", "-q", "-t", image, context)
            jobs.append((who, image))
    finally:
        shutil.rmtree(context)

    def migrate(job):
        who, image = job
        return in_store(who, project_store)("migrate", image, check=False)

    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(migrate, jobs))
    for (_, image), result in zip(jobs, results, strict=True):
        assert result.returncode == 0 and result.stdout.startswith(f"squashed: {image} "), result

    records = json.loads((project_store / "overlay-images" / "images.json").read_text())
    assert sorted(n for r in records for n in r.get("names") or []) == sorted(image for _, image in jobs)
    links = project_store / "overlay" / "l"
    assert len(list(links.glob("*.squash"))) == len(jobs)  # one squash file per image, no other
    assert not [p.name for p in links.glob(".*") if not p.name.endswith(".lock")]  # no partial squash file
    for who, image in jobs:  # each member runs each image from the store
        out = in_store(who, project_store)("run", "--rm", image, "cat", "/name").stdout.strip()
        assert out == image.split("/")[-1].split("-")[0]
