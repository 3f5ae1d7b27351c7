"""Scale model: what a job step costs each node as the node count grows, and what each read path
reads from the shared store per node.

Steps: `true` as steps of one allocation of the stack's nodes (`STACK_NODES=16 dev/stack up`),
pinned to n1..nN (`srun --jobid J --overlap -w ...`), at 1, 2, 4, 8 and 16 nodes (as many as the
stack has) x 1 and 8 tasks, for bare srun, podman-exec, per-process and podman-hpc 1.2.2's
shared-run. Metrics of each step:

- ``step_seconds``: wall time of the srun. On this machine's 2 cores every node's work shares the
  same CPUs, so it grows with the node count for every configuration.
- ``node_cpu_seconds``: CPU of everything the step ran on a node, mean over the step's nodes. dev/stack
  runs each slurmd in a cpuacct cgroup of its own, which slurmstepd, the tasks, podman, conmon, the
  containers and a podman-exec step monitor all stay in (rootless podman cannot leave it on cgroup v1).
  It is read before the step and again once the node runs nothing the step started (a podman-exec
  monitor removes its container after srun returns). This is the figure that says what happens at
  scale, where each node has its own cores.
- ``login_cpu_seconds``: srun's own CPU on the login side (where the fan-out starts).
- ``ctld_cpu_seconds``: slurmctld's CPU during the step.

Read bytes: on node n1, with a node-local storage and unpack cache of its own, a container runs a
workload through each read path (``squash_read_path``): the base image importing what a kernel needs,
and the DeepCAM-like image importing torch. The squash file's pages are dropped from the page cache
first; the pages in the cache afterwards are what the node read from the shared store (readahead
included, as a shared file system's client reads ahead too), ``*_step_seconds`` the step's wall time.
``fresh``: the node has never run the image (the mount program checks the squash file's digest, once
per node and file, before its first use); ``checked``: a later job's first step on that node, which
remembers the check, its unpacked copy gone.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from common import (
    BenchError,
    PrivateStorage,
    Sample,
    alternating,
    ensure_pulled,
    pulled_store,
    squash_file,
    store_env,
    timed,
)

BENCHMARK = "scale"
READS = "scale-reads"
IN_TURN = "podman-exec, nodes in turn"
LAUNCH_CONFIGS = ["bare", "podman-exec", "per-process", "1.2.2 shared-run"]  # the launch benchmark's
CONFIGS = [*LAUNCH_CONFIGS[:2], IN_TURN, *LAUNCH_CONFIGS[2:]]
TURN_SECONDS = 2  # between two nodes' starts in IN_TURN: more than a podman-exec node's whole work here
NODE_COUNTS = (1, 2, 4, 8, 16)
TASKS = (1, 8)
SMOKE_NODE_COUNTS, SMOKE_TASKS = (1, 2), (1,)
READ_PATHS = ("unpacked", "kernel", "fuse")
IMPORTS = "import asyncio, email.mime.multipart, http.server, json, sqlite3, ipykernel.kernelapp"
QUIET_TIMEOUT = 20.0


def node_counts(available: int, smoke: bool) -> list[int]:
    """The node counts to measure: those of the model that the stack has."""
    wanted = SMOKE_NODE_COUNTS if smoke else NODE_COUNTS
    counts = [count for count in wanted if count <= available]
    if not counts:
        raise BenchError("the stack has no nodes")
    return counts


def configurations(
    launch: Mapping[str, Callable[[int, int], tuple[list[str], dict]]],
) -> dict[str, Callable[[int, int], tuple[list[str], dict]]]:
    """The launch benchmark's configurations (``LAUNCH_CONFIGS``), and podman-exec with its nodes in turn."""
    table = dict(launch)
    table[IN_TURN] = in_turn(launch["podman-exec"])
    return {name: table[name] for name in CONFIGS if name in table}


def in_turn(command: Callable[[int, int], tuple[list[str], dict]]) -> Callable[[int, int], tuple[list[str], dict]]:
    """``command``'s step with node i starting ``TURN_SECONDS`` x i after node 0: each node's work then runs
    alone on this machine's 2 cores, as on a cluster where every node has its own. Beside ``command``'s
    figure at the same size, it separates the CPU that the node count adds in our design from the CPU that
    16 nodes' processes sharing 2 cores cost each other."""

    def step(nodes: int, per_node: int) -> tuple[list[str], dict]:
        argv, env = command(nodes, per_node)
        wait = f'sleep "$((SLURM_NODEID * {TURN_SECONDS}))"; exec "$@"'
        return [*argv[:3], "sh", "-c", wait, "sh", *argv[3:]], env

    return step


def host_list(nodes: int) -> str:
    return f"n[1-{nodes}]" if nodes > 1 else "n1"


class NodeCpu:
    """CPU time and processes of the stack's nodes, from their cpuacct cgroups (``STACK_NODE_CGROUPS``)."""

    def __init__(self, root: str):
        if not root or not Path(root, "n1", "cpuacct.usage").exists():
            raise BenchError(
                "the stack's nodes have no cpuacct cgroups (STACK_NODE_CGROUPS): per-node CPU "
                "needs cgroup v1's cpuacct hierarchy, as on these machines (host-notes)"
            )
        self.root = Path(root)

    def seconds(self, node: str) -> float:
        return int((self.root / node / "cpuacct.usage").read_text()) / 1e9

    def processes(self, node: str) -> set[int]:
        return {int(pid) for pid in (self.root / node / "cgroup.procs").read_text().split()}

    def wait_quiet(self, before: Mapping[str, set[int]], timeout: float = QUIET_TIMEOUT) -> bool:
        """Wait until no node runs a process it did not run before the step; False on timeout."""
        deadline = time.monotonic() + timeout
        while any(self.processes(node) - known for node, known in before.items()):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True


def slurmctld_seconds() -> float:
    import psutil

    for process in psutil.process_iter(["name", "cpu_times"]):
        if process.info["name"] == "slurmctld" and process.info["cpu_times"]:
            times = process.info["cpu_times"]
            return times.user + times.system
    raise BenchError("no slurmctld runs on this host")


def children_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def command(
    config: str, table: Mapping[str, Callable[[int, int], tuple[list[str], dict]]], job: str, nodes: int, per_node: int
) -> tuple[list[str], dict]:
    """``config``'s step on n1..n``nodes`` of allocation ``job`` (the launch benchmark's command)."""
    argv, env = table[config](nodes, per_node)
    assert argv[:3] == ["srun", f"-N{nodes}", f"--ntasks-per-node={per_node}"]
    return ["srun", "--jobid", job, "--overlap", "-w", host_list(nodes), *argv[1:]], env


def measure(
    table: Mapping[str, Callable[[int, int], tuple[list[str], dict]]],
    env: Mapping[str, str],
    counts: Sequence[int],
    tasks: Sequence[int],
    repetitions: int,
    log: Callable[[str], None] = print,
) -> list[Sample]:
    """Wall, per-node, login and controller CPU of every configuration's step at every size."""
    from steps import allocate

    cpu = NodeCpu(os.environ.get("STACK_NODE_CGROUPS", ""))
    job = allocate(max(counts), env)
    try:
        for config in table:  # warm up: every node's storage
            argv, step_env = command(config, table, job, max(counts), 1)
            timed(argv, step_env)
        samples = []
        for repetition in range(repetitions):
            for nodes in counts:
                for per_node in tasks:
                    for config in alternating(list(table), repetition):
                        argv, step_env = command(config, table, job, nodes, per_node)
                        samples += _step(cpu, config, argv, step_env, nodes, per_node, repetition, log)
        return samples
    finally:
        subprocess.run(["scancel", job], env=env, capture_output=True)


def _step(
    cpu: NodeCpu,
    config: str,
    argv: list[str],
    env: Mapping[str, str],
    nodes: int,
    per_node: int,
    repetition: int,
    log: Callable[[str], None],
) -> list[Sample]:
    names = [f"n{number}" for number in range(1, nodes + 1)]
    before = {node: cpu.processes(node) for node in names}
    node_cpu = {node: cpu.seconds(node) for node in names}
    ctld, login = slurmctld_seconds(), children_seconds()
    seconds, _ = timed(argv, env)
    login = children_seconds() - login
    if not cpu.wait_quiet(before):
        log(
            f"scale {config} {nodes}x{per_node}: the nodes still ran the step's processes "
            f"{QUIET_TIMEOUT:.0f} s after it ended; their CPU so far is counted"
        )
    per_node_cpu = statistics.mean(cpu.seconds(node) - node_cpu[node] for node in names)
    ctld = slurmctld_seconds() - ctld
    size = f"{nodes}x{per_node}"
    log(
        f"scale {config:<18} {size:>5} rep {repetition}: {seconds:.2f} s, {per_node_cpu:.3f} CPU-s a node, "
        f"srun {login:.3f}, slurmctld {ctld:.3f}"
    )
    return [
        Sample(BENCHMARK, config, size, repetition, "step_seconds", seconds),
        Sample(BENCHMARK, config, size, repetition, "node_cpu_seconds", per_node_cpu),
        Sample(BENCHMARK, config, size, repetition, "login_cpu_seconds", login),
        Sample(BENCHMARK, config, size, repetition, "ctld_cpu_seconds", ctld),
    ]


# --- bytes each read path reads from the shared store ----------------------------------


def resident_bytes(path: Path) -> int:
    """The bytes of ``path`` in the page cache (util-linux's fincore)."""
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.split()[0])


def drop_cached(path: Path) -> None:
    """Drop ``path``'s clean pages from the page cache, as on a node that has not read it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Reading:
    """A workload whose first step on a fresh node the read-bytes measurement runs."""

    name: str
    image: str
    store: Path  # the squashed store that holds ``image``
    code: str  # what python3 runs in the container


def kernel_reading(base: str) -> Reading:
    """The base image importing what a kernel needs."""
    ensure_pulled(base)
    return Reading("kernel imports", base, pulled_store(), IMPORTS)


def measure_reads(readings: Sequence[Reading], repetitions: int, log: Callable[[str], None] = print) -> list[Sample]:
    """Per read path and workload: MiB of the squash file read, and the step's seconds, on a fresh node
    and on a node that has checked the file before (its copies and mounts gone)."""
    samples = []
    for reading in readings:
        squash = squash_file(reading.store, reading.image)
        size = squash.stat().st_size / 2**20
        for repetition in range(repetitions):
            for mode in alternating(list(READ_PATHS), repetition):
                for state, (read, seconds) in _first_steps(reading, squash, mode).items():
                    log(
                        f"scale-reads {reading.name} {mode:<9} {state:<7} rep {repetition}: {read:.1f} of "
                        f"{size:.0f} MiB read, step {seconds:.2f} s"
                    )
                    samples += [
                        Sample(READS, mode, reading.name, repetition, f"{state}_store_mib", read),
                        Sample(READS, mode, reading.name, repetition, f"{state}_step_seconds", seconds),
                    ]
    return samples


def _first_steps(reading: Reading, squash: Path, mode: str) -> dict[str, tuple[float, float]]:
    """MiB of ``squash`` read through read path ``mode``, and the step's seconds: on node n1 fresh (the
    mount program checks the file's digest, once per node, before its first use), then ``checked``: the
    node remembers the check, its unpacked copy is gone (a later job's first step)."""
    storage = PrivateStorage(f"scale-{os.getpid()}")
    env = {**storage.env(store_env(reading.store)), "PODMANHPC_SQUASH_READ_PATH": mode}
    argv = ["srun", "-N1", "-w", "n1", "podman-hpc", "shared-run", reading.image, "python3", "-c", reading.code]
    forget = ["srun", "-N1", "-w", "n1", "podman", "unshare", "rm", "-rf", env["PODMANHPC_SQUASH_UNPACK_DIR"]]
    steps = {}
    try:
        for state in ("fresh", "checked"):
            drop_cached(squash)
            before = resident_bytes(squash)
            seconds, _ = timed(argv, env)
            steps[state] = ((resident_bytes(squash) - before) / 2**20, seconds)
            timed(forget, env)
        return steps
    finally:
        storage.remove_on("n1")


def main(argv: list[str] | None = None) -> int:
    """Some configurations at some sizes, without the rest of ``make bench``: per-step lines, then medians
    of CPU per node (``bench/scale.py --configs podman-exec "podman-exec, nodes in turn" --nodes 1 16``)."""
    import argparse
    import datetime as dt

    import launch
    from common import remove_tree, summarize

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--configs", nargs="+", default=CONFIGS, choices=CONFIGS)
    parser.add_argument("--nodes", nargs="+", type=int, default=list(NODE_COUNTS))
    parser.add_argument("--tasks", nargs="+", type=int, default=list(TASKS))
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--image", default=os.environ.get("STACK_BASE_IMAGE"))
    args = parser.parse_args(argv)
    work = Path(os.environ["SCRATCH"]) / "bench" / dt.datetime.now().strftime("scale-%Y%m%d-%H%M%S")
    work.mkdir(parents=True)
    try:
        with_peer = "1.2.2 shared-run" in args.configs
        setup = launch.prepare(args.image, work, with_peer=with_peer)
        launch_table = launch.configurations(
            setup, [name for name in LAUNCH_CONFIGS if with_peer or not name.startswith("1.2.2")]
        )
        table = {name: command for name, command in configurations(launch_table).items() if name in args.configs}
        medians = summarize(measure(table, setup.ours_env, args.nodes, args.tasks, args.repetitions))
        for config in table:
            for nodes in args.nodes:
                for per_node in args.tasks:
                    stats = medians[(BENCHMARK, "node_cpu_seconds", f"{nodes}x{per_node}", config)]
                    print(
                        f"{config:<28} {nodes:>2}x{per_node}: median {stats['median']:.3f} CPU-s a node "
                        f"({stats['min']:.3f}-{stats['max']:.3f})"
                    )
    finally:
        remove_tree(work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
