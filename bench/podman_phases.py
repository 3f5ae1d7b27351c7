#!/usr/bin/env python3
"""Podman's own phases in a container start, from the kernel's process events (run as root).

    bench/podman_phases.py [--repetitions N] [--node n1] -- COMMAND...

``perf record`` takes the scheduler's exec, fork and exit tracepoints on the whole host while COMMAND
runs (as the stack's user, with its environment: dev/as-user). Only the processes that descend from
COMMAND, or from node ``--node``'s slurmd (a step's tasks, podman, conmon, the runtime and the step
monitor, which slurmd starts, not srun), are kept. Every program they exec is a row: when it started
after COMMAND did, and how long it ran (exec to exit), medians over the repetitions. A tracepoint costs
microseconds, where ``podman --log-level debug`` stretched a run to seconds, and strace every syscall.

The rows are podman's phases: ``podman`` up to ``conmon`` (storage, image, the mount program, the OCI
spec); ``conmon`` and the first ``runc`` (``runc create``: namespaces, the root's pivot, ``runc init``
waiting); the second ``runc`` (``runc start``) and the container's command, which ``runc init`` execs;
then the ``--rm`` clean-up (a second ``podman``: ``podman container cleanup``, which conmon execs once
the container has ended). A row's number counts the program's runs within one start.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

EVENTS = ["sched:sched_process_exec", "sched:sched_process_fork", "sched:sched_process_exit"]
STACK_RUN = Path("/var/lib/jph-stack/run")
LINE = re.compile(
    r"^\s*(?P<comm>.+?)\s+(?P<pid>\d+)/(?P<tid>\d+)\s+(?P<time>[\d.]+):\s+sched:(?P<event>\w+):\s+(?P<rest>.*)$"
)


@dataclass
class Program:
    name: str  # what was exec'd
    pid: int
    start: float
    end: float | None = None


def record(command: list[str], data: Path) -> int:
    """Run ``command`` under perf record; the pid perf gave it is the first exec of the trace's tree."""
    events = [arg for event in EVENTS for arg in ("-e", event)]
    result = subprocess.run(
        ["perf", "record", "-q", "-a", "-o", str(data), *events, "--", *command], stdout=subprocess.DEVNULL
    )
    return result.returncode


def timeline(data: Path, roots: set[int]) -> list[Program]:
    """The programs of the recording ``data`` (see ``parse``)."""
    script = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "comm,pid,tid,time,event,trace"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return parse(script, roots)


def parse(script: str, roots: set[int]) -> list[Program]:
    """The programs exec'd by ``roots``' processes and their descendants (forks seen in ``perf script``'s
    text); the first exec of the trace is the command perf ran, and the first program."""
    ours = set(roots)
    programs: list[Program] = []
    running: dict[int, Program] = {}  # by process (thread group): the program it runs, exec'd or forked into
    first_exec = None
    for line in script.splitlines():
        match = LINE.match(line)
        if not match:
            continue
        event, rest, time = match["event"], match["rest"], float(match["time"])
        pid = int(match["pid"])
        if event == "sched_process_exec":
            if first_exec is None:  # perf's own child, exec'ing the command
                first_exec = pid
                ours.add(pid)
            if pid in ours:
                before = running.get(pid)
                if before is not None and before.pid == pid:  # the pid ran a program of its own: it ends
                    before.end = time
                running[pid] = Program(_name(re.search(r"filename=(\S+)", rest)[1]), pid, time)
                programs.append(running[pid])
        elif event == "sched_process_fork":
            child = int(re.search(r"child_pid=(\d+)", rest)[1])
            if pid in ours:
                ours.add(child)
                if pid in running:
                    running.setdefault(child, running[pid])  # a forked process runs on in its parent's program
        elif event == "sched_process_exit" and "group_dead=true" in rest and pid in running:
            program = running.pop(pid)  # a program ends with the last process that runs it
            program.end = max(program.end or time, time)
    return programs


def _name(filename: str) -> str:
    """The program's name; ``runc init`` runs as /proc/self/exe, then from a sealed copy (/dev/fd/N)."""
    return "runc init" if filename.startswith(("/proc/self/", "/dev/fd/")) else os.path.basename(filename)


def table(runs: list[list[Program]]) -> str:
    """Medians of each program's start and duration, by name and occurrence within the run."""
    starts: dict[tuple[str, int], list[float]] = defaultdict(list)
    durations: dict[tuple[str, int], list[float]] = defaultdict(list)
    order: dict[tuple[str, int], float] = {}
    for programs in runs:
        t0 = programs[0].start
        seen: dict[str, int] = defaultdict(int)
        for program in programs:
            key = (program.name, seen[program.name])
            seen[program.name] += 1
            starts[key].append(program.start - t0)
            if program.end is not None:
                durations[key].append(program.end - program.start)
    for key, values in starts.items():
        order[key] = statistics.median(values)
    rows = ["| program | runs | starts at (ms) | runs for (ms) |", "|---|---|---|---|"]
    for key in sorted(order, key=order.get):
        name, index = key
        runs_for = f"{statistics.median(durations[key]) * 1000:.1f}" if durations[key] else "—"
        label = name if index == 0 else f"{name} ({index + 1})"
        rows.append(f"| {label} | {len(starts[key])} | {order[key] * 1000:.1f} | {runs_for} |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--node", help="also keep what this stack node's slurmd starts (a job step's node side)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if os.geteuid() != 0 or not command:
        parser.error("run as root, with the command after --")
    roots: set[int] = set()
    if args.node:
        roots.add(int((STACK_RUN / f"slurmd-{args.node}.pid").read_text().split()[0]))
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for repetition in range(args.repetitions + 1):
            data = Path(tmp) / f"run{repetition}.data"
            if record(command, data) != 0:
                print(f"the command failed (repetition {repetition})", file=sys.stderr)
                return 1
            if repetition:  # the first run warms the caches
                runs.append(timeline(data, roots))
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
