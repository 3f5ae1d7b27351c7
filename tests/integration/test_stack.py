"""Smoke tests: the cluster-in-a-box is real and behaves like an HPC system."""

import collections
import ipaddress
import os
import uuid
from pathlib import Path

import pytest

from tests.helpers.commands import run

REPO = Path(__file__).resolve().parents[2]
MPI_ENV = {  # the shared-memory transport crashes across nodes sharing one kernel
    "OMPI_MCA_btl": "self,tcp",
    "OMPI_MCA_btl_tcp_if_include": "lo",
    "OMPI_MCA_oob_tcp_if_include": "lo",
}


def test_status_reports_every_component_up(stack):
    result = run([REPO / "dev" / "stack", "status"])
    lines = result.stdout.splitlines()
    assert len(lines) >= 10
    nodes = run(["sinfo", "-N", "-h", "-o", "%N %t %E"], check=False)  # why a slurmd is down
    assert all(line.endswith(" up") for line in lines), result.stdout + nodes.stdout + nodes.stderr


def test_rootless_podman_runs_the_base_image(stack):
    assert run(["id", "-u"]).stdout.strip() != "0"
    result = run(["podman", "run", "--rm", stack.base_image, "cat", "/etc/os-release"])
    assert "VERSION_CODENAME=bookworm" in result.stdout
    assert run(["podman", "info", "--format", "{{.Host.Security.Rootless}}"]).stdout.strip() == "true"


def test_srun_spreads_two_tasks_on_each_of_four_nodes(stack):
    result = run(["srun", "-N4", "-n8", "sh", "-c", 'echo "$SLURMD_NODENAME $SLURM_LOCALID $SLURM_PROCID"'])
    rows = [line.split() for line in result.stdout.splitlines()]
    assert sorted(int(procid) for _, _, procid in rows) == list(range(8))
    per_node = collections.defaultdict(list)
    for node, localid, _ in rows:
        per_node[node].append(int(localid))
    assert {node: sorted(ids) for node, ids in per_node.items()} == {node: [0, 1] for node in stack.nodes}


def test_bare_metal_mpi_allreduce_across_four_nodes(stack):
    program = stack.work_dir("mpi") / "allreduce.py"
    program.write_text(
        "from mpi4py import MPI\n"
        "comm = MPI.COMM_WORLD\n"
        "print(comm.rank, comm.size, comm.allreduce(comm.rank + 1), MPI.Get_processor_name())\n"
    )
    result = run(["srun", "-N4", "-n8", "--mpi=pmix", "/usr/bin/python3", program], env=_env_with(MPI_ENV))
    rows = sorted(line.split() for line in result.stdout.splitlines())
    assert [int(r[0]) for r in rows] == list(range(8))
    assert {(r[1], r[2]) for r in rows} == {("8", "36")}  # size 8, sum of 1..8


def test_registry_round_trips_an_image(stack, tmp_path):
    token = uuid.uuid4().hex
    reference = f"{stack.registry}/tests/roundtrip:{token[:12]}"
    (tmp_path / "Containerfile").write_text(f"FROM {stack.base_image}\nRUN echo {token} > /token\n")
    run(["podman", "build", "--network", "host", "-t", reference, tmp_path])
    try:
        run(["podman", "push", reference])
        run(["podman", "rmi", reference])
        assert run(["podman", "image", "exists", reference], check=False).returncode == 1
        run(["podman", "pull", reference])
        assert run(["podman", "run", "--rm", reference, "cat", "/token"]).stdout.strip() == token
    finally:
        run(["podman", "rmi", "--ignore", reference], check=False)


@pytest.mark.parametrize("directory", ["/tmp", "/dev/shm"])
def test_each_node_has_a_private_tmp_and_dev_shm(stack, directory):
    """As on a cluster: what one node unpacks into its /dev/shm, another pays for again."""
    name = f"{directory}/private-{uuid.uuid4().hex}"
    run(["srun", "-N1", "-w", "n1", "touch", name])
    try:
        assert run(["srun", "-N1", "-w", "n1", "test", "-e", name], check=False).returncode == 0
        assert run(["srun", "-N1", "-w", "n2", "test", "-e", name], check=False).returncode != 0
        assert not Path(name).exists()  # nor on the login side
    finally:
        run(["srun", "-N1", "-w", "n1", "rm", "-f", name], check=False)


def test_each_node_accounts_the_cpu_of_everything_it_runs(stack, squashed_base):
    """The scale benchmark's per-node CPU (bench/scale.py): a node's cpuacct cgroup holds its steps,
    and a container's processes, which rootless podman cannot move out of it."""
    root = Path(os.environ["STACK_NODE_CGROUPS"])
    cgroups = run(
        [
            "srun",
            "-N4",
            "--ntasks-per-node=1",
            "sh",
            "-c",
            'echo "$SLURMD_NODENAME $(grep -E "^[0-9]+:([^:]*,)?cpuacct(,[^:]*)?:" /proc/self/cgroup)"',
        ]
    )
    by_node = dict(line.split(" ", 1) for line in cgroups.stdout.splitlines())
    assert {node: line.rsplit(":", 1)[1] for node, line in by_node.items()} == {
        node: f"/{root.name}/{node}" for node in stack.nodes
    }
    usage = root / "n3" / "cpuacct.usage"
    before = int(usage.read_text())
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass\n"
    squashed_base.srun("-N1", "-w", "n3", "podman-hpc", "run", "--rm", stack.base_image, "python3", "-c", burn)
    spent = (int(usage.read_text()) - before) / 1e9
    assert spent >= 1.0, f"n3 accounted {spent:.2f} CPU-s for a container that burnt 1 s"


def test_stack_listens_on_loopback_only(stack):
    listeners = _tcp_listeners()
    stack_ports = {5000, 16306, 16817, 16819, 17001, 17002, 17003, 17004}
    assert stack_ports <= {port for _, port in listeners}, "a stack daemon is not listening"
    exposed = [
        (addr, port)
        for addr, port in listeners
        if port in stack_ports and not addr.startswith("127.") and addr != "::1"
    ]
    assert exposed == []


def _tcp_listeners() -> list[tuple[str, int]]:
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state != "0A":  # LISTEN
                continue
            hex_addr, hex_port = local.split(":")
            found.append((_decode_addr(hex_addr, width), int(hex_port, 16)))
    return found


def _decode_addr(hex_addr: str, width: int) -> str:
    raw = bytes.fromhex(hex_addr)
    # /proc/net/tcp* print each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def _env_with(extra: dict[str, str]) -> dict[str, str]:
    return {**os.environ, **extra}
