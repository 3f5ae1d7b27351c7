"""`bench/run.py --smoke` end to end on the stack: every benchmark gives a table,
every configuration a sample, every table a plot.

What `make bench-smoke` runs, in a subprocess as a user would. The first run on
a machine also builds the benchmark images and the generated workload (cached
in $SCRATCH/bench afterwards), hence the long timeout.
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

import pytest

from tests.helpers.commands import run

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import cluster  # noqa: E402
import deepcam  # noqa: E402
import kernel  # noqa: E402
import lammps  # noqa: E402
import pynamic  # noqa: E402
import readpath  # noqa: E402
import run as bench_run  # noqa: E402
import scale  # noqa: E402
import steps  # noqa: E402

EXPECTED = {  # benchmark -> (configurations, metrics)
    "launch": (bench_run.LAUNCH_CONFIGS, ["step_seconds"]),
    "steps": (steps.CONFIGS, ["step_seconds"]),
    "scale": (scale.CONFIGS, ["step_seconds", "node_cpu_seconds", "login_cpu_seconds", "ctld_cpu_seconds"]),
    "scale-reads": (
        list(scale.READ_PATHS),
        [f"{state}_{metric}" for state in ("fresh", "checked") for metric in ("store_mib", "step_seconds")],
    ),
    "lammps": (lammps.CONFIGS, ["loop_seconds", "step_seconds"]),
    "pynamic": (pynamic.CONFIGS, ["step_seconds", "import_seconds", "visit_seconds"]),
    "deepcam": (deepcam.CONFIGS, [*deepcam.PHASES, "step_seconds"]),
    "readpath": (readpath.CANDIDATES, ["import_seconds"]),
    "squash": (["plain mksquashfs", "ours", "1.2.2"], ["squash_seconds"]),
    "kernel": ([*kernel.CONFIGS, kernel.LOGIN, *kernel.FIRST_KERNEL_DELAYS], ["ready_seconds"]),
    "cluster": (cluster.CONFIGS, ["start_seconds"]),
}


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(2400)
def test_smoke_run_measures_every_benchmark_and_configuration(stack, tmp_path):
    output = tmp_path / "results"
    result = run([sys.executable, str(BENCH / "run.py"), "--smoke", "--output", str(output)], timeout=2300)
    assert "results: " in result.stdout, result.stdout[-3000:]
    [markdown] = output.glob("*-smoke.md")
    [raw] = output.glob("*-smoke.csv")
    text = markdown.read_text()
    assert "## Machine" in text and "| podman |" in text and "| slurm |" in text
    assert "## Failures" not in text, text

    with open(raw, newline="") as file:
        samples = list(csv.DictReader(file))
    assert set(EXPECTED) == {s["benchmark"] for s in samples}
    for benchmark, (configs, metrics) in EXPECTED.items():
        measured = {(s["config"], s["metric"]) for s in samples if s["benchmark"] == benchmark}
        missing = {(c, m) for c in configs for m in metrics} - measured
        assert not missing, f"{benchmark}: no samples for {sorted(missing)}"
        for metric in metrics:
            heading = f"## {benchmark}: {metric.replace('_', ' ')}"
            assert heading in text, f"no table {heading!r}"
            table = text.split(heading, 1)[1].split("\n## ", 1)[0]
            header = next(line for line in table.splitlines() if line.startswith("| size |"))
            for config in configs:
                assert f"| {config} ({bench_run.report.unit(metric)}) |" in header, (benchmark, metric, config, header)
            baseline = bench_run.report.BASELINES[benchmark]
            assert f"− {baseline}" in header, f"{benchmark}: no comparison with {baseline}"
            image = f"{markdown.stem}-{benchmark}-{metric}.png"
            assert f"]({image})" in table
            png = output / image
            assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    for sample in samples:  # slurmctld may spend less than a clock tick on a step
        assert float(sample["value"]) >= 0 if sample["metric"] == "ctld_cpu_seconds" else float(sample["value"]) > 0, (
            sample
        )
    assert re.search(r"## pynamic: step seconds\n\nGenerated workload", text)

    # DeepCAM-like: the phases stacked per size, as the published figure shows them
    phases = text.split("## deepcam: phases", 1)[1].split("\n## ", 1)[0]
    for nodes, per_node in deepcam.SMOKE_SIZES:
        size = f"{nodes}x{per_node}"
        for config in deepcam.CONFIGS:
            assert f"| {size} | {config} |" in phases, (size, config, phases)
        png = output / f"{markdown.stem}-deepcam-phases-{size}.png"
        assert f"]({png.name})" in phases and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
