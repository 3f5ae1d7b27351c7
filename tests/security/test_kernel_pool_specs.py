"""A kernelspec a project member planted is never started by the server itself (issue 38).

A group-writable kernels directory in the project directory, on the user's
``JUPYTER_PATH``, is a common way to share kernels. hpcuser2 (the ``member``)
plants a container kernelspec there, in a 2770 and in a 3770 one, whose
``podman_args`` mount the member's ``sitecustomize.py`` into every container of
it. The user's server used to start a warm pool container of every container
kernelspec at its start: the member's code ran with the user's ``$HOME``
mounted, with no click. Now the user's own kernelspec gets its pool container
and the planted ones get none, with one warning line each naming the kernelspec
and who else may write it; a planted kernelspec still starts when the user
picks it, and nothing is left once the server stops.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from pathlib import Path

import pytest

from jupyter_podman_hpc.kernels import kernelspec
from tests.helpers.commands import run
from tests.helpers.pools import install, open_notebook, pool_containers, wait_for
from tests.helpers.servers import http, jupyter_server, run_cell

pytestmark = pytest.mark.slow

SITECUSTOMIZE = "open({marker!r}, 'a').write('the member ran here\\n')\n"
WRITE_FILE = 'mkdir -m 0755 "$1" && cat > "$1/$2" && chmod 0644 "$1/$2"'


@pytest.fixture
def shared_jupyter_dirs(member):
    """Two Jupyter data directories in the project directory, as the user made them for the project:
    a 2770 kernels directory and a 3770 one (group jphproj)."""
    base = Path(os.environ["STACK_PROJECT_DIR"]) / f"sec-kernels-{uuid.uuid4().hex[:8]}"
    dirs = [base / "setgid", base / "sticky"]
    for directory, mode in zip(dirs, (0o2770, 0o3770), strict=True):
        (directory / "kernels").mkdir(parents=True)
        for made in (base, directory):
            made.chmod(0o2770)
        (directory / "kernels").chmod(mode)
    yield dirs
    member.sh("rm", "-rf", base, check=False)  # sticky: what the member made, the member removes
    run(["rm", "-rf", str(base)], check=False)


def plant(member, kernels: Path, name: str, image: str, payload: Path) -> Path:
    """A kernelspec of ``image`` written by the member into ``kernels``, its containers importing
    the member's ``payload`` directory at their start; its directory."""
    spec = kernelspec.kernel_json(
        image,
        display_name=f"Project kernel ({name})",
        podman_args=["-v", f"{payload}:/planted:ro", "-e", "PYTHONPATH=/planted"],
    )
    member.sh("sh", "-c", WRITE_FILE, "sh", kernels / name, "kernel.json", input=json.dumps(spec))
    return kernels / name


def test_a_planted_kernelspec_starts_only_when_picked(
    kernel_site,
    stack,
    member,
    shared_jupyter_dirs,
    tmp_path,
):
    root = tmp_path / "notebooks"
    root.mkdir()
    marker = root / "member-ran"  # the server's root directory: every kernel container mounts it
    payload = shared_jupyter_dirs[0].parent / "payload"
    member.sh("sh", "-c", WRITE_FILE, "sh", payload, "sitecustomize.py", input=SITECUSTOMIZE.format(marker=str(marker)))
    # named to come first: the server would warm them before the user's own
    planted = {
        f"a-project-{d.name}": plant(member, d / "kernels", f"a-project-{d.name}", stack.base_image, payload)
        for d in shared_jupyter_dirs
    }
    install(kernel_site, stack, "z-own", None)  # the user's own, in their data directory: the default pool
    site = dataclasses.replace(
        kernel_site,
        env={
            **kernel_site.env,
            "JUPYTER_PATH": os.pathsep.join([*map(str, shared_jupyter_dirs), kernel_site.env["JUPYTER_PATH"]]),
        },
    )
    log = tmp_path / "server.log"
    with jupyter_server(site, root, log) as (base, token, _):
        wait_for("the pool container of the user's own kernelspec", lambda: pool_containers(site, "z-own"), 90)
        text = log.read_text()
        for name, directory in planted.items():
            assert pool_containers(site, name) == [], name
            assert f"kernel(s) of {name}:" not in text, text[-3000:]
            [line] = [line for line in text.splitlines() if f"no kernel pool for {name}:" in line]
            assert (
                line.startswith("[W ")
                and f"kernelspec {directory}/kernel.json starts only when picked: " in line
                and "jphproj" in line
            ), line
        assert not marker.exists()

        # picked by the user for a notebook: it starts, as the member wrote it
        kernel_id = open_notebook(base, token, "picked.ipynb", next(iter(planted)))
        assert site.container_names(kernel_id) == [f"podman-hpc-kernel-{kernel_id}"]
        assert "the member ran here" in marker.read_text()  # at its start, before the user runs a cell
        assert run_cell(base, token, kernel_id, "print('picked', 6 * 7)").strip() == "picked 42"
        status, _ = http("DELETE", f"{base}/api/kernels/{kernel_id}", token)
        assert status == 204 and site.containers(kernel_id) == []
    assert site.containers() == []
