"""``%podman_hpc cluster``: IPython Parallel engines in the base image on the 4-node cluster.

A real kernel starts a 4 x 2 cluster of podman-exec ranks with Open MPI, runs
``%%px`` cells on it and stops it; then nothing is left: no job, container,
controller process, connection file or listening port. A kernel killed with
SIGKILL takes its cluster with it (its watchdog stops the controller and
cancels the job). Bad input gives one line and leaves nothing running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_podman_hpc.kernels.orphans import owner_alive
from tests.helpers.commands import run
from tests.helpers.magics_kernel import MPI_ENV, short_error, start_session

pytestmark = pytest.mark.slow


def queued(hpc, job_id: str) -> bool:
    """Whether Slurm still has the job pending, running or completing (other tests' jobs aside)."""
    result = run(["squeue", "-h", "-j", job_id, "-t", "PD,CF,R,CG", "-o", "%i"], env=hpc.env)
    return job_id in result.stdout.split()


def cluster_dirs(hpc) -> list[Path]:
    jobs = hpc.work / "scratch" / "podman-hpc" / "jobs"
    return sorted(p.parent for p in jobs.glob("*/cluster.json"))


def record(directory: Path) -> dict:
    return json.loads((directory / "cluster.json").read_text())


def ports(directory: Path) -> list[int]:
    """The controller's ports, from its connection files (every whole number in them is one)."""
    found = set()
    for path in (directory / "ipython" / "security").glob("ipcontroller-*.json"):
        info = json.loads(path.read_text())
        found |= {value for value in info.values() if isinstance(value, int) and not isinstance(value, bool)}
    return sorted(found)


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def assert_nothing_left(hpc, directory: Path, listened: list[int]) -> None:
    data = record(directory)
    assert data["state"] == "stopped", data
    assert not queued(hpc, data["job_id"]), data
    assert hpc.leftovers(within=30) == {}
    for token in (data["controller"], data["watchdog"]):
        assert token and not owner_alive(token), data
    security = directory / "ipython" / "security"
    assert not list(security.glob("*.json")), list(security.iterdir())
    assert listened and not [port for port in listened if listening(port)]


def test_a_4x2_mpi_cluster_runs_px_cells_and_stop_leaves_nothing(base_kernel, squashed_base, stack):
    kernel = base_kernel
    before = cluster_dirs(squashed_base)
    cell = kernel.execute(
        f"cluster = %podman_hpc cluster start --nodes 4 --tasks-per-node 2 --time 10 "
        f"--module openmpi-pmix {MPI_ENV} {stack.base_image}"
    )
    assert cell.ok, cell.show()
    assert "8/8 engines registered" in cell.stdout, cell.show()
    assert "engines, job " in cell.stdout.splitlines()[-1] and "%%px runs on them" in cell.stdout, cell.show()
    [directory] = [d for d in cluster_dirs(squashed_base) if d not in before]
    listened = ports(directory)
    assert listened and all(listening(port) for port in listened)

    cell = kernel.execute(
        "%%px\n"
        "import os\n"
        "from mpi4py import MPI\n"
        "total = MPI.COMM_WORLD.allreduce(MPI.COMM_WORLD.rank, op=MPI.SUM)\n"
        "node = os.environ['SLURMD_NODENAME']\n"
    )
    assert cell.ok, cell.show()
    cell = kernel.execute(
        "rc = cluster.client()\n"
        "view = rc[:]\n"
        "(sorted(rc.ids), view.pull('total', block=True), sorted(set(view.pull('node', block=True))))"
    )
    assert cell.ok, cell.show()
    ids, totals, nodes = eval(cell.result["text/plain"])  # noqa: S307 - lists of ints and str
    assert ids == list(range(8)) and totals == [28] * 8
    assert nodes == list(stack.nodes)

    cell = kernel.execute("%podman_hpc cluster list")
    assert cell.ok and " 8/8 engines " in cell.stdout and "n[1-4]" in cell.stdout, cell.show()

    cell = kernel.execute("%podman_hpc cluster stop")
    assert cell.ok and cell.stdout.startswith("Stopped cluster "), cell.show()
    assert_nothing_left(squashed_base, directory, listened)
    cell = kernel.execute("%podman_hpc cluster list")
    assert cell.ok and cell.stdout == "No running clusters started by this kernel\n", cell.show()


@contextlib.contextmanager
def doomed_cluster(hpc, image: str, tmp_path: Path) -> Iterator[tuple[object, Path, list[int]]]:
    """A kernel that started a 2-node cluster, for a test to kill: (its session, the cluster's job
    directory, the controller's ports). The session and the directory go afterwards."""
    session = start_session(hpc, tmp_path / "doomed")
    before = cluster_dirs(hpc)
    started = []
    try:
        cell = session.execute(f"cluster = %podman_hpc cluster start --nodes 2 --time 10 {image}")
        assert cell.ok, cell.show()
        started = [d for d in cluster_dirs(hpc) if d not in before]
        [directory] = started
        yield session, directory, ports(directory)
    finally:
        session.kc.stop_channels()
        session.km.cleanup_resources()
        for directory in started:
            run(["rm", "-rf", str(directory)])


def test_a_kernel_killed_with_sigkill_leaves_nothing(squashed_base, stack, tmp_path):
    """The watchdog sees the kernel go (a pidfd), stops the controller and cancels the job."""
    with doomed_cluster(squashed_base, stack.base_image, tmp_path) as (session, directory, listened):
        job_id = record(directory)["job_id"]
        assert queued(squashed_base, job_id)
        os.kill(session.km.provisioner.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        # the watchdog writes the record's state last, once the job and the controller are gone
        while (
            queued(squashed_base, job_id)
            or any(owner_alive(record(directory)[part]) for part in ("controller", "watchdog"))
        ) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert_nothing_left(squashed_base, directory, listened)


def test_the_sweep_stops_what_a_killed_kernel_and_watchdog_left(squashed_base, stack, tmp_path):
    """The fallback: with the watchdog SIGKILLed too, the controller lives on; the next sweep
    (any cluster start, the server's listing) stops it and cancels the job."""
    from jupyter_podman_hpc.slurm import SlurmClient
    from jupyter_podman_hpc.slurm.cluster import sweep

    with doomed_cluster(squashed_base, stack.base_image, tmp_path) as (_, directory, listened):
        data = record(directory)
        for token in (data["watchdog"], data["owner"]):
            os.kill(int(token.split(":")[0]), signal.SIGKILL)
        time.sleep(1)
        assert owner_alive(data["controller"]) and queued(squashed_base, data["job_id"])  # left behind
        swept = sweep(directory.parent, client=SlurmClient(env=squashed_base.env))
        assert swept == [data["cluster_id"]]
        deadline = time.monotonic() + 60
        while queued(squashed_base, data["job_id"]) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert_nothing_left(squashed_base, directory, listened)


@pytest.fixture(scope="module")
def without_ipyparallel(squashed_base, stack):
    """An image with python3 but without ipyparallel, in the squashed store."""
    ref = "localhost/jph-tests/no-ipyparallel:1"
    containerfile = squashed_base.work / "Containerfile.no-ipp"
    containerfile.write_text(
        f"FROM {stack.base_image}\nRUN rm -rf /usr/local/lib/python3.11/dist-packages/ipyparallel*\n"
    )
    squashed_base("build", "--tls-verify=false", "-t", ref, "-f", containerfile, squashed_base.work)
    squashed_base("migrate", ref)
    squashed_base.wipe_local_storage()  # the build pulled the base image: the store's tests expect it squashed only
    yield ref
    squashed_base("rmsqi", ref, check=False)


BAD = {
    "zero nodes": ("--nodes 0 {base}", "nodes must be between 1 and 100000, not 0"),
    "missing image": ("localhost/no-such-image:1", "is not in the squashed store"),
    "no ipyparallel": ("{no_ipp}", "the image needs ipyparallel"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_gives_one_line_and_leaves_nothing_running(base_kernel, squashed_base, stack, case, request):
    words, expected = BAD[case]
    no_ipp = request.getfixturevalue("without_ipyparallel") if "{no_ipp}" in words else ""
    before = cluster_dirs(squashed_base)
    cell = base_kernel.execute(
        "%podman_hpc cluster start --time 5 " + words.format(base=stack.base_image, no_ipp=no_ipp)
    )
    text = short_error(cell)
    assert expected in text and len(text.splitlines()) == 1, text
    started = [d for d in cluster_dirs(squashed_base) if d not in before]
    assert len(started) == (1 if case == "no ipyparallel" else 0)
    for directory in started:  # the job it submitted ended, and nothing of it runs
        data = record(directory)
        assert data["state"] == "stopped" and not owner_alive(data["controller"]), data
        assert not queued(squashed_base, data["job_id"]), data
        assert not list((directory / "ipython" / "security").glob("*.json"))
