"""Munge, the accounting database, slurmdbd, slurmctld and the slurmd nodes (four by default).

Every daemon runs with the loopback bind shim preloaded (Slurm has no option
to choose its listening address), and each slurmd has a private /tmp and a
private /dev/shm (a tmpfs of its own), as a real compute node has: a copy
unpacked into one node's /dev/shm is not seen by another, nor by the host (the
login node), so every node pays its own unpack, as on a cluster. Each node runs
in a cpuacct cgroup of its own (``layout.node_cgroup``), which accounts the CPU
of everything it starts.
"""

import hashlib
import os
import pwd
import secrets
import shutil
import signal
import socket
from collections.abc import Sequence
from pathlib import Path

from . import layout
from .proc import exited, run, running_pid, say, start_daemon, stop_daemon, succeeds, wait_for, write_if_changed


def _daemon_env() -> dict[str, str]:
    return {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "SLURM_CONF": str(layout.SLURM_CONF),
        "LD_PRELOAD": str(layout.BIND_SHIM),
    }


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


# --- munge -----------------------------------------------------------------


def munge_works() -> bool:
    return succeeds(["sh", "-c", "munge -n | unmunge"])


def munge_up() -> None:
    if munge_works():
        return
    stop_daemon("munged")
    munge = pwd.getpwnam("munge")
    run_dir = Path("/run/munge")
    run_dir.mkdir(parents=True, exist_ok=True)
    os.chown(run_dir, munge.pw_uid, munge.pw_gid)
    run_dir.chmod(0o755)
    if not Path("/etc/munge/munge.key").exists():
        run(["runuser", "-u", "munge", "--", "mungekey", "--create"])
    say("starting munged")
    # --force: a socket left by a killed munged must not stop us.
    start_daemon(
        "munged", ["runuser", "-u", "munge", "--", "/usr/sbin/munged", "--foreground", "--force"], ready=munge_works
    )


# --- accounting database ---------------------------------------------------


def _db_password() -> str:
    """slurmdbd's database password, made once. The file is created 0600 (O_EXCL: never through a
    link, never at the umask's mode for a moment) and renamed into place whole."""
    path = layout.MARIADB_DIR / "slurm.password"
    if not path.exists():
        layout.MARIADB_DIR.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)  # what a killed first start left
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(16))
        os.replace(tmp, path)
    return path.read_text().strip()


def _mariadb_socket() -> Path:
    return layout.MARIADB_DIR / "run" / "mysqld.sock"


def _sql(statement: str) -> None:
    run(["mariadb", "--no-defaults", f"--socket={_mariadb_socket()}", "-u", "root", "-e", statement])


def mariadb_up() -> None:
    if running_pid("mariadb"):
        return
    data = layout.MARIADB_DIR / "data"
    mysql = pwd.getpwnam("mysql")
    if not (data / "mysql").is_dir():
        say("initialising the accounting database")
        fresh = layout.MARIADB_DIR / "data.init"
        shutil.rmtree(fresh, ignore_errors=True)
        fresh.mkdir(parents=True)
        os.chown(fresh, mysql.pw_uid, mysql.pw_gid)
        run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={fresh}",
                "--user=mysql",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ]
        )
        shutil.rmtree(data, ignore_errors=True)
        os.replace(fresh, data)
    run_dir = _mariadb_socket().parent
    run_dir.mkdir(exist_ok=True)
    os.chown(run_dir, mysql.pw_uid, mysql.pw_gid)
    _mariadb_socket().unlink(missing_ok=True)
    say("starting mariadb")
    start_daemon(
        "mariadb",
        [
            "mariadbd",
            "--no-defaults",
            f"--datadir={data}",
            "--user=mysql",
            f"--socket={_mariadb_socket()}",
            f"--port={layout.MARIADB_PORT}",
            "--bind-address=127.0.0.1",
            f"--pid-file={run_dir / 'mariadbd.pid'}",
            "--innodb-buffer-pool-size=64M",
            "--skip-name-resolve",
        ],
        ready=lambda: succeeds(["mariadb-admin", "--no-defaults", f"--socket={_mariadb_socket()}", "ping"]),
    )
    password = _db_password()
    _sql(
        f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}';"
        f"ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}';"
        "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
    )


# --- Slurm configuration ---------------------------------------------------


def _slurm_conf() -> str:
    d = layout.SLURM_DIR
    first, last = layout.node_port(layout.NODES[0]), layout.node_port(layout.NODES[-1])
    nodes, ports, cpus = layout.nodes_expr(), f"[{first}-{last}]", layout.NODE_CPUS
    return f"""\
# Written by jupyter-podman-hpc's dev/stack: {len(layout.NODES)} nodes on one host.
ClusterName={layout.CLUSTER}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={layout.SLURMCTLD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd-%n.pid
SlurmctldLogFile={layout.LOG}/slurmctld.log
SlurmdLogFile={layout.LOG}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SrunPortRange={layout.SRUN_PORT_RANGE}
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={layout.SLURMDBD_PORT}
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=300
KillWait=5
InactiveLimit=0
# A node that stops answering (tests/faults/test_node_death.py kills one) is set DOWN and its jobs
# end NODE_FAIL 30-40 s later (a ping every 10 s): srun learns of a dead node only then. No slurmd
# missed a single ping in a day of make test, stress tests and benchmarks (slurmctld.log, 2026-12-02).
SlurmdTimeout=30
NodeName={nodes} NodeHostname=localhost NodeAddr=127.0.0.1 Port={ports} CPUs={cpus} RealMemory=2000 State=UNKNOWN
# Whole nodes per job, as on Perlmutter: `srun -N4 -n8` then spreads 2 tasks per node.
PartitionName={layout.PARTITION} Nodes={nodes} Default=YES MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE
"""


def _slurmdbd_conf() -> str:
    return f"""\
# Written by jupyter-podman-hpc's dev/stack.
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={layout.SLURMDBD_PORT}
SlurmUser=root
AuthType=auth/munge
PidFile={layout.SLURM_DIR}/run/slurmdbd.pid
LogFile={layout.LOG}/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={layout.MARIADB_PORT}
StorageUser=slurm
StoragePass={_db_password()}
StorageLoc=slurm_acct_db
"""


def write_slurm_config() -> bool:
    """Write slurm.conf and slurmdbd.conf; True if either changed."""
    for sub in ("state", "spool", "run"):
        (layout.SLURM_DIR / sub).mkdir(parents=True, exist_ok=True)
    changed = write_if_changed(layout.SLURM_CONF, _slurm_conf())
    return write_if_changed(layout.SLURMDBD_CONF, _slurmdbd_conf(), mode=0o600) or changed


# --- daemons ---------------------------------------------------------------


def slurmdbd_up() -> None:
    if running_pid("slurmdbd"):
        return
    say("starting slurmdbd")
    start_daemon("slurmdbd", ["slurmdbd", "-D"], env=_daemon_env(), ready=lambda: _port_open(layout.SLURMDBD_PORT))
    env = _daemon_env()
    clusters = run(["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"], env=env).stdout.split()
    if layout.CLUSTER not in clusters:
        run(["sacctmgr", "-i", "add", "cluster", layout.CLUSTER], env=env)


def _sinfo_states() -> dict[str, str]:
    if shutil.which("sinfo") is None:  # a fresh machine: Slurm is not installed yet
        return {}
    result = run(["sinfo", "-N", "-h", "-o", "%N %t"], check=False, env=_daemon_env())
    if result.returncode != 0:
        return {}
    return dict(line.split() for line in result.stdout.splitlines() if line.strip())


def slurmctld_up() -> None:
    if running_pid("slurmctld"):
        return
    say("starting slurmctld")
    start_daemon(
        "slurmctld",
        ["slurmctld", "-D"],
        env=_daemon_env(),
        ready=lambda: succeeds(["scontrol", "ping"], env=_daemon_env()),
    )


def _identity(path: str) -> str:
    """Which directory ``path`` is (device and inode), "" for none."""
    try:
        info = os.stat(path) if path else None
    except OSError:
        return ""
    return f"{info.st_dev}:{info.st_ino}" if info else ""


def _checkout_for_nodes() -> str:
    """The checkout, if the nodes' private /tmp would hide it ("" otherwise).

    The stack's venv has the project installed in editable mode from the
    checkout, so ranks on the nodes import it from there.
    """
    return str(layout.CHECKOUT) if Path("/tmp") in layout.CHECKOUT.parents else ""


# Run inside the node's own mount namespace: the node joins its cgroup (if any)
# with everything it will start, the checkout (if under /tmp) is bound aside
# first, /tmp becomes the node's directory, the checkout is bound back at its
# path, /dev/shm becomes a tmpfs of the node's own (freed with the namespace,
# when the node's last process ends: its reboot), and / is made shared, as
# rootless podman expects.
_NODE_NAMESPACE = """\
tmp=$1 node=$2 checkout=$3 aside=$4 cgroup=$5
if [ -n "$cgroup" ]; then echo $$ > "$cgroup/cgroup.procs"; fi
if [ -n "$checkout" ]; then mkdir -p "$aside" && mount --bind "$checkout" "$aside"; fi
mount --bind "$tmp" /tmp
if [ -n "$checkout" ]; then mkdir -p "$checkout" && mount --bind "$aside" "$checkout" && umount "$aside"; fi
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
mount --make-rshared /
exec slurmd -D -N "$node"
"""


def _node_processes(node_tmp: Path) -> set[int]:
    """Every process of the node: those whose /tmp is the node's, those in its cgroup (a ``runc
    init`` whose conmon was killed has pid 1 as its parent and the container's mounts), and every
    process below them (a container's, whose /tmp is its own)."""
    children: dict[int, list[int]] = {}
    cgroup = layout.node_cgroup(node_tmp.parent.name)
    try:
        found = [int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()] if cgroup else []
    except OSError:
        found = []  # not made yet: the node never ran
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            mounts = (entry / "mountinfo").read_text().splitlines()
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(entry.name))
        if any(f.split()[3:5] == [str(node_tmp), "/tmp"] for f in mounts if len(f.split()) > 4):
            found.append(int(entry.name))
    node: set[int] = set()
    while found:
        pid = found.pop()
        if pid not in node:
            node.add(pid)
            found += children.get(pid, [])
    return node


def _power_off(node_tmp: Path) -> None:
    """What a power loss does to a node: every process of it stops at once and dies.

    All are stopped first (SIGSTOP), until a look finds none not stopped, then killed: none
    gets to react to another's death (a step monitor removing its container once slurmstepd is
    gone, a podman it would start that a kill in one pass would miss), as none can when the
    power goes.
    """
    stopped = {os.getpid()}  # run on the node itself, this would stop itself
    while new := _node_processes(node_tmp) - stopped:
        for pid in new:
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
        stopped |= new
    stopped.discard(os.getpid())
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    wait_for(lambda: all(exited(pid) for pid in stopped), "the node's processes to exit", timeout=30)


def _reboot_node(node_tmp: Path) -> None:
    """Before a node's slurmd starts: what a reboot does to a compute node.

    Every process whose /tmp is the node's (podman's pause processes, conmon,
    mount helpers, squashfuse) is killed with what runs below it (the
    containers), and the node-local /tmp (tmpfs on a real node) is emptied.
    Podman joins a user's pause process for its namespaces, or without one
    the namespaces of a running container's conmon, so either would keep the
    mounts of the old namespace (an old checkout) for every later container;
    and with them killed but its state kept, podman finds containers it
    believes running and refuses to start ("invalid internal status").
    """
    _power_off(node_tmp)
    for entry in node_tmp.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def kill_node(node: str) -> None:
    """`dev/stack node-kill NODE`: the node loses its power. Its slurmd dies with every process
    of the node (slurmstepd, the tasks, their containers, podman, mount helpers), none of them
    cleaning up; slurmctld hears nothing more from it. Its /dev/shm goes with its last process,
    its /tmp is emptied at its boot."""
    _power_off(layout.node_tmp(node))
    if running_pid(f"slurmd-{node}") is not None:  # its /tmp is the node's: it cannot have survived
        raise SystemExit(f"[stack] slurmd {node} survived its node's power loss")
    say(f"node {node} is off")


def boot_node(node: str, timeout: float = 180) -> None:
    """`dev/stack node-boot NODE`: a node that is off (node-kill, a crash) boots as `up` boots
    it (/tmp emptied, slurmd started), and is back in service: resumed if slurmctld set it down
    meanwhile, and idle once slurmctld has finished what it ended there (a job completing)."""
    slurmd_up(node)  # a node that runs is left as it is
    wait_for(
        lambda: (resume_nodes([node]), _usable(_sinfo_states().get(node, "")))[1],
        f"node {node} to be idle again",
        timeout=timeout,
    )
    say(f"node {node} is up and idle")


def slurmd_up(node: str) -> None:
    name = f"slurmd-{node}"
    checkout = _checkout_for_nodes()
    started_with = layout.NODE_ROOT / node / "checkout"
    # a checkout removed and cloned again at the same path is another directory: the
    # node's bind mount still shows the old one; a changed namespace script (what a node
    # has of its own) needs a reboot too
    script = hashlib.sha256(_NODE_NAMESPACE.encode()).hexdigest()[:12]
    seen = f"{checkout} {_identity(checkout)} {script}"
    if running_pid(name):
        if started_with.exists() and started_with.read_text() == seen:
            return
        say(f"restarting slurmd {node}: the checkout it must see, or its namespace, changed")
        stop_daemon(name)
    tmp = layout.node_tmp(node)
    tmp.mkdir(parents=True, exist_ok=True)
    tmp.chmod(0o1777)
    _reboot_node(tmp)
    started_with.write_text(seen)
    cgroup = layout.node_cgroup(node)
    if cgroup:
        cgroup.mkdir(parents=True, exist_ok=True)
    say(f"starting slurmd {node}")
    start_daemon(
        name,
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            _NODE_NAMESPACE,
            "sh",
            str(tmp),
            node,
            checkout,
            str(layout.NODE_ROOT / node / "checkout-aside"),
            str(cgroup or ""),
        ],
        env=_daemon_env(),
        ready=lambda: _port_open(layout.node_port(node)),
    )


def _usable(state: str) -> bool:
    # A trailing "*" means slurmctld has not heard from the node: jobs sent there would wait forever.
    return state in ("idle", "mix", "alloc")


def _responding(state: str) -> bool:
    """slurmctld hears from the node and may give it work: busy finishing a job ("comp"),
    held for a pending one ("plnd") or reserved counts; down, drained or failed does not."""
    return (
        bool(state)
        and "*" not in state
        and state.rstrip("~#!%$@^-") not in ("down", "drain", "drng", "fail", "failg", "unk", "inval")
    )


def nodes_idle() -> bool:
    states = _sinfo_states()
    return all(_usable(states.get(node, "")) for node in layout.NODES)


def resume_nodes(nodes: Sequence[str] = ()) -> None:
    """Nodes (default: all) restarted after a crash may come back down or drained."""
    nodes = nodes or layout.NODES
    states = _sinfo_states()
    stuck = [n for n in nodes if states.get(n, "").rstrip("*~#") in ("down", "drain", "drng", "fail")]
    if stuck:
        run(["scontrol", "update", f"nodename={','.join(stuck)}", "state=resume"], check=False, env=_daemon_env())


def _nodes_with_state() -> list[str]:
    """The stack's nodes and any node an earlier `up` with more nodes left behind."""
    found = {entry.name for entry in layout.NODE_ROOT.glob("n*") if entry.name[1:].isdigit()}
    return sorted(found | set(layout.NODES), key=lambda node: int(node[1:]))


def _retire_extra_nodes() -> None:
    """Power off the nodes an earlier `up` started beyond today's count, with all they ran."""
    for node in _nodes_with_state():
        if node not in layout.NODES:
            if layout.node_tmp(node).is_dir():
                _power_off(layout.node_tmp(node))
            stop_daemon(f"slurmd-{node}")
            shutil.rmtree(layout.NODE_ROOT / node, ignore_errors=True)
            cgroup = layout.node_cgroup(node)
            if cgroup and cgroup.is_dir():
                try:
                    cgroup.rmdir()  # empty once its processes are dead
                except OSError as error:
                    say(f"the cgroup of node {node} stays: {error}")
            say(f"node {node} is no longer in the stack")


def up() -> None:
    munge_up()
    mariadb_up()
    if write_slurm_config():
        say("Slurm configuration changed: restarting Slurm")
        _stop_slurm()
    slurmdbd_up()
    slurmctld_up()
    _retire_extra_nodes()
    for node in layout.NODES:
        slurmd_up(node)
    wait_for(
        lambda: (resume_nodes(), nodes_idle())[1],
        f"{len(layout.NODES)} idle Slurm nodes",
        timeout=90 + 5 * len(layout.NODES),
    )


def _stop_slurm() -> None:
    for node in reversed(_nodes_with_state()):
        stop_daemon(f"slurmd-{node}")
    for name in ("slurmctld", "slurmdbd"):
        stop_daemon(name)


def down() -> None:
    _stop_slurm()
    for name in ("mariadb", "munged"):
        stop_daemon(name)


def status() -> dict[str, bool]:
    states = _sinfo_states()
    result = {
        "munge": munge_works(),
        "mariadb": running_pid("mariadb") is not None,
        "slurmdbd": running_pid("slurmdbd") is not None and _port_open(layout.SLURMDBD_PORT),
        "slurmctld": running_pid("slurmctld") is not None and bool(states),
    }
    for node in layout.NODES:
        result[f"slurmd {node}"] = running_pid(f"slurmd-{node}") is not None and _responding(states.get(node, ""))
    return result
