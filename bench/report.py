"""The results file: machine, one table and plot per benchmark, ratios against bare metal."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import deepcam
from common import Failure, Sample, markdown_table, summarize, write_csv

# The configuration each benchmark's other configurations are compared with (same run, same size).
BASELINES = {
    "launch": "bare",
    "steps": "bare",
    "scale": "bare",
    "scale-reads": "unpacked",
    "squash": "plain mksquashfs",
    "lammps": "bare",
    "pynamic": "bare",
    "kernel": "local ipykernel",
    "deepcam": "bare",
    "readpath": "plain directory",
    "cluster": "bare srun",
}
# Benchmarks whose metrics include consecutive phases of one run: also a stacked bar per size.
PHASES = {deepcam.BENCHMARK: deepcam.PHASES}


def _cell(stats: dict[str, float] | None) -> str:
    if stats is None:
        return "—"
    return f"{stats['median']:.2f} ({stats['min']:.2f}–{stats['max']:.2f})"


def _order(sizes):
    def key(size: str):
        parts = size.split("x")
        return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else (size,)

    return sorted(sizes, key=key)


def unit(metric: str) -> str:
    """A metric's unit, from its name's ending: ``_mib`` or ``_seconds``."""
    return "MiB" if metric.endswith("_mib") else "s"


def table(samples: Sequence[Sample], benchmark: str, metric: str) -> str:
    stats = summarize(s for s in samples if s.benchmark == benchmark and s.metric == metric)
    configs = list(dict.fromkeys(s.config for s in samples if s.benchmark == benchmark and s.metric == metric))
    sizes = _order({size for (_, _, size, _) in stats})
    baseline = BASELINES.get(benchmark)
    header = ["size", *[f"{c} ({unit(metric)})" for c in configs]]
    if baseline in configs:
        header += [f"{c} − {baseline}" for c in configs if c != baseline]
    rows = []
    for size in sizes:
        row = [size, *[_cell(stats.get((benchmark, metric, size, c))) for c in configs]]
        base = stats.get((benchmark, metric, size, baseline))
        if base:
            for c in configs:
                if c != baseline:
                    other = stats.get((benchmark, metric, size, c))
                    row.append(
                        f"{other['median'] - base['median']:+.2f} {unit(metric)} "
                        f"({other['median'] / base['median']:.2f}x)"
                        if other and base["median"]
                        else "—"
                    )  # a CPU time may be 0 ticks
        rows.append(row)
    return markdown_table(header, rows)


def _pyplot():
    import matplotlib  # on first use: importing it takes a good part of a second

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(samples: Sequence[Sample], benchmark: str, metric: str, path: Path) -> None:
    plt = _pyplot()
    stats = summarize(s for s in samples if s.benchmark == benchmark and s.metric == metric)
    configs = list(dict.fromkeys(s.config for s in samples if s.benchmark == benchmark and s.metric == metric))
    sizes = _order({size for (_, _, size, _) in stats})
    figure, axes = plt.subplots(figsize=(10, 5))
    width = 0.8 / max(len(configs), 1)
    for i, config in enumerate(configs):
        found = [stats.get((benchmark, metric, size, config)) for size in sizes]
        values = [s["median"] if s else 0 for s in found]
        spread = [
            [s["median"] - s["min"] if s else 0 for s in found],
            [s["max"] - s["median"] if s else 0 for s in found],
        ]
        axes.bar([x + i * width for x in range(len(sizes))], values, width, label=config, yerr=spread, capsize=2)
    axes.set_xticks([x + width * (len(configs) - 1) / 2 for x in range(len(sizes))], sizes)
    axes.set_ylabel(f"{metric.replace('_', ' ')} (median, min–max)")
    axes.set_title(benchmark)
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _phase_name(metric: str) -> str:
    return metric.removesuffix("_seconds").replace("_", " ")


def phase_table(samples: Sequence[Sample], benchmark: str, phases: Sequence[str]) -> str:
    """Per size and configuration: each phase's median, their sum, and the start (all phases
    but the last) against the baseline's."""
    stats = summarize(s for s in samples if s.benchmark == benchmark and s.metric in phases)
    configs = list(dict.fromkeys(s.config for s in samples if s.benchmark == benchmark))
    baseline = BASELINES.get(benchmark)
    start = " + ".join(_phase_name(m) for m in phases[:-1])
    header = [
        "size",
        "configuration",
        *[f"{_phase_name(m)} (s)" for m in phases],
        "sum (s)",
        f"{start} (s)",
        f"{start} vs {baseline}",
    ]
    rows = []
    for size in _order({size for (_, _, size, _) in stats}):
        medians = {
            c: [stats[(benchmark, m, size, c)]["median"] if (benchmark, m, size, c) in stats else None for m in phases]
            for c in configs
        }
        base = medians.get(baseline)
        base_start = sum(base[:-1]) if base and None not in base else None
        for config in configs:
            values = medians[config]
            if None in values:
                rows.append([size, config, *["—"] * (len(phases) + 3)])
                continue
            own_start = sum(values[:-1])
            versus = f"{own_start - base_start:+.2f} s ({own_start / base_start:.2f}x)" if base_start else "—"
            rows.append([size, config, *[f"{v:.2f}" for v in values], f"{sum(values):.2f}", f"{own_start:.2f}", versus])
    return markdown_table(header, rows)


def plot_phases(samples: Sequence[Sample], benchmark: str, phases: Sequence[str], size: str, path: Path) -> None:
    """One size: a bar per configuration, stacked from the phases' medians (the published figure's view)."""
    plt = _pyplot()
    stats = summarize(s for s in samples if s.benchmark == benchmark and s.size == size and s.metric in phases)
    configs = list(dict.fromkeys(s.config for s in samples if s.benchmark == benchmark and s.size == size))
    figure, axes = plt.subplots(figsize=(7.5, 4.5))
    bottoms = [0.0] * len(configs)
    for metric in phases:
        values = [
            stats[(benchmark, metric, size, c)]["median"] if (benchmark, metric, size, c) in stats else 0
            for c in configs
        ]
        axes.bar(range(len(configs)), values, 0.6, bottom=bottoms, label=_phase_name(metric))
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    axes.set_xticks(range(len(configs)), configs)
    axes.set_ylabel("seconds (medians)")
    axes.set_title(f"{benchmark} {size} (nodes x tasks per node)")
    handles, labels = axes.get_legend_handles_labels()  # top to bottom, as the bars stack
    axes.legend(handles[::-1], labels[::-1], fontsize="small", loc="upper left", bbox_to_anchor=(1, 1))
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write(
    samples: Sequence[Sample],
    machine: dict[str, str],
    directory: Path,
    stem: str,
    smoke: bool,
    notes: Mapping[str, str] | None = None,
    failures: Sequence[Failure] = (),
) -> Path:
    """``<stem>.md`` (machine, one table and plot per benchmark and metric, failures), ``<stem>.csv``
    (every sample) and ``<stem>-<benchmark>-<metric>.png``; ``notes`` describe a benchmark's set-up."""
    notes = notes or {}
    directory.mkdir(parents=True, exist_ok=True)
    write_csv(samples, directory / f"{stem}.csv")
    lines = [f"# Benchmark results {stem}", ""]
    if smoke:
        lines += ["Smoke run: one repetition at the smallest sizes; it checks the code, not the numbers.", ""]
    lines += ["## Machine", "", markdown_table(["", ""], machine.items()), ""]
    lines += [
        "Cells: median (min–max) over the repetitions, in seconds; the last columns give the",
        "difference and ratio of each configuration's median to the baseline measured in the same run.",
        "",
    ]
    described: set[str] = set()
    for benchmark, metric in dict.fromkeys((s.benchmark, s.metric) for s in samples):
        lines += [f"## {benchmark}: {metric.replace('_', ' ')}", ""]
        if benchmark in notes and benchmark not in described:
            described.add(benchmark)
            lines += [notes[benchmark], ""]
        lines += [table(samples, benchmark, metric), ""]
        image = f"{stem}-{benchmark}-{metric}.png"
        plot(samples, benchmark, metric, directory / image)
        lines += [f"![{benchmark}]({image})", ""]
    for benchmark, phases in PHASES.items():
        measured = [s for s in samples if s.benchmark == benchmark and s.metric in phases]
        if not measured:
            continue
        lines += [f"## {benchmark}: phases", "", phase_table(samples, benchmark, phases), ""]
        for size in _order({s.size for s in measured}):
            image = f"{stem}-{benchmark}-phases-{size}.png"
            plot_phases(samples, benchmark, phases, size, directory / image)
            lines += [f"![{benchmark} {size}]({image})", ""]
    if failures:
        lines += ["## Failures", "", "Runs that gave no number (they are missing from the tables above):", ""]
        lines += [
            markdown_table(
                ["benchmark", "configuration", "size", "repetition", "error"],
                [
                    (
                        f.benchmark,
                        f.config,
                        f.size,
                        f.repetition if f.repetition >= 0 else "—",
                        f.message.replace("|", "/").replace("\n", " "),
                    )
                    for f in failures
                ],
            ),
            "",
        ]
    lines += [f"Raw samples: [{stem}.csv]({stem}.csv)", ""]
    path = directory / f"{stem}.md"
    path.write_text("\n".join(lines))
    return path
