"""The example notebooks, run top to bottom on the stack and checked with nbval.

Each notebook runs in a pytest of its own (a subprocess): nbval collects
notebooks only with ``--nbval``, which this session does not pass, and its
kernel (``--nbval-current-env``: this virtual environment's ipykernel) runs
in the stack user's default engine configuration, as a user's notebook does
(the squashed store is ``$SCRATCH/storage``), not in a test's private one.
Outputs that vary between runs are sanitized (``sanitize.cfg``) or marked
``# NBVAL_IGNORE_OUTPUT`` in the notebooks. nbval runs headless, so the
stored outputs are the magics' text form.

To refresh the stored outputs after changing a notebook, execute it as the
stack user and save it (``dev/as-user jupyter nbconvert --to notebook
--execute --inplace examples/NAME.ipynb``), then check the diff.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.helpers.commands import run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SANITIZE = Path(__file__).with_name("sanitize.cfg")
# What a notebook of the stack user sees: no test's private storage, no forced rendering.
PRIVATE = (
    "PODMANHPC_GRAPH_ROOT",
    "PODMANHPC_RUN_ROOT",
    "PODMANHPC_CONFIG_HOME",
    "SQUASH_DIR",
    "PODMAN_HPC_WIDGETS",
    "CONTAINERS_REGISTRIES_CONF",
)
# Images a notebook makes and removes at its end: removed first too, should an earlier run
# have stopped half-way (its outputs would then differ).
LEFTOVERS = {"01-build-and-squash.ipynb": ["localhost/jph-examples/hello:1"]}


def notebooks() -> list[Path]:
    return sorted(EXAMPLES.glob("*.ipynb"))


def test_there_are_examples():
    names = [path.name for path in notebooks()]
    assert {"01-build-and-squash.ipynb", "02-run-at-scale.ipynb"} <= set(names)


@pytest.mark.parametrize("notebook", notebooks(), ids=lambda path: path.stem)
def test_example_runs_and_matches_its_outputs(stack, notebook):
    env = {key: value for key, value in os.environ.items() if key not in PRIVATE}
    for image in LEFTOVERS.get(notebook.name, []):
        run(["podman-hpc", "rmsqi", image], env=env, check=False)
        run(["podman-hpc", "rmi", "--force", image], env=env, check=False)
    result = run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--nbval",
            "--nbval-current-env",
            "--nbval-sanitize-with",
            str(SANITIZE),
            "-p",
            "no:cacheprovider",
            "-q",
            "-rN",
            str(notebook.relative_to(ROOT)),
        ],
        cwd=ROOT,
        env=env,
        check=False,
        timeout=1500,
    )
    assert result.returncode == 0, (
        f"nbval failed for {notebook.name}:\n{result.stdout[-12000:]}\n{result.stderr[-3000:]}"
    )
