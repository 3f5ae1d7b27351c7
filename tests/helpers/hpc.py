"""podman-hpc on the real stack with private storage per test (``Hpc``, ``make_hpc``, ``cleanup_hpc``),
a squashed store made for a test, and the variables that point a job's ranks at such a store."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from jupyter_podman_hpc.engine.mount.cache import CachedCopy
from tests.helpers.commands import run
from tests.helpers.stack import Stack

# On a node: the copies in the unpack cache (argv[1]), as JSON (each node's /dev/shm is its own).
_NODE_COPIES = (
    "import dataclasses, json, sys; from pathlib import Path; "
    "from jupyter_podman_hpc.engine.mount.cache import copies; "
    "print(json.dumps([dataclasses.asdict(c) for c in copies(Path(sys.argv[1]))]))"
)


@dataclass
class Hpc:
    """podman-hpc as the stack user, with a graph root of its own on every node
    (a fresh "compute node") and its own squashed store on the shared scratch."""

    stack: Stack
    env: dict[str, str]
    squash_dir: Path
    work: Path
    # another stack user this acts as (the project's second member, the outsider), through
    # the sudo rule the stack writes; "" for the test's own user
    user: str = ""

    def command(self, argv) -> tuple[list[str], dict[str, str]]:
        """(argv, env) that run ``argv`` as this user with this environment (for Popen)."""
        argv = [str(a) for a in argv]
        if not self.user:
            return argv, self.env
        pairs = [f"{k}={v}" for k, v in self.env.items()]
        return ["sudo", "-n", "-u", self.user, "--", "env", "-i", *pairs, *argv], dict(os.environ)

    def sh(self, *argv, check: bool = True, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
        command, env = self.command(argv)
        return run(command, env=env, check=check, timeout=timeout, **kwargs)

    def __call__(self, *args, check: bool = True, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
        return self.sh("podman-hpc", *args, check=check, timeout=timeout, **kwargs)

    def srun(self, *args, check: bool = True, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
        return self.sh("srun", *args, check=check, timeout=timeout, **kwargs)

    def on_each_node(self, *command, check: bool = True, job: str | None = None) -> dict[str, str]:
        """Run a command once on every node (in ``job``'s allocation, if given); its output by node name."""
        inside = ["--jobid", job, "--overlap"] if job else []
        result = self.srun(
            *inside,
            f"-N{len(self.stack.nodes)}",
            "--ntasks-per-node=1",
            "--label",
            "sh",
            "-c",
            'echo "@$SLURMD_NODENAME"; exec "$@"',
            "sh",
            *command,
            check=check,
        )
        outputs: dict[str, list[str]] = {}
        by_task: dict[str, list[str]] = {}
        for line in result.stdout.splitlines():
            task, _, text = line.partition(": ")
            by_task.setdefault(task.strip(), []).append(text)
        for lines in by_task.values():
            outputs[lines[0].lstrip("@")] = lines[1:]
        return {node: "\n".join(lines) for node, lines in outputs.items()}

    def leftovers(self, within: float = 30, job: str | None = None) -> dict[str, str]:
        """Per node: this storage's containers, step directories, pid files, mounts, conmons and orphaned
        ``runc init`` processes that remain once the nodes have had up to ``within`` seconds to clean up (a
        step's monitor removes its container after the step's tasks have ended, so after srun returns)."""
        script = (
            'podman-hpc ps -a --format "container {{.Names}} {{.Status}}"; '
            'ls -A "$PODMANHPC_RUN_ROOT/shared-run" 2>/dev/null | sed "s/^/stepdir /"; '
            'ls -A "$PODMANHPC_RUN_ROOT/per-process" 2>/dev/null | sed "s/^/pidfile /"; '
            'podman unshare cat /proc/self/mountinfo | grep -F -e "$PODMANHPC_RUN_ROOT" -e "$SQUASH_DIR" '
            '-e "$PODMANHPC_SQUASH_UNPACK_DIR" | sed "s/^/mount /"; '
            # a conmon whose container record is gone (its pid file is under the run root)
            'ps -u "$(id -u)" -o pid=,comm=,args= | awk -v root="-p $PODMANHPC_RUN_ROOT/" '
            '\'$2 == "conmon" && index($0, root) { for (i = 3; i < NF; i++) if ($i == "-n") '
            'print "conmon", $1, $(i + 1) }\'; '
            # a runc init whose conmon is gone: its parent is neither conmon nor runc create
            'ps -u "$(id -u)" -o pid=,ppid=,args= | awk \'$3 ~ /(^|\\/)runc$/ && $4 == "init" '
            "{ print $1, $2 }' | while read -r pid parent; do "
            'case "$(cat /proc/$parent/comm 2>/dev/null)" in conmon|runc*) ;; *) echo "runc-init $pid";; '
            "esac; done; true"
        )
        deadline = time.monotonic() + within
        while True:
            outputs = self.on_each_node("sh", "-c", script, job=job)
            assert sorted(outputs) == list(self.stack.nodes)
            remaining = {node: text for node, text in outputs.items() if text.strip()}
            if not remaining or time.monotonic() > deadline:
                return remaining
            time.sleep(1)

    @property
    def unpack_dir(self) -> Path:
        return Path(self.env["PODMANHPC_SQUASH_UNPACK_DIR"])

    def unpacked(self, node: str) -> list[CachedCopy]:
        """The unpack cache's copies on ``node``, least recently used first: a node's /dev/shm
        is its own, as on a cluster, so they are read there."""
        out = self.srun("-w", node, sys.executable, "-c", _NODE_COPIES, self.unpack_dir).stdout
        return [CachedCopy(**copy) for copy in json.loads(out)]

    def exists_on(self, node: str, path: Path | str) -> bool:
        return self.srun("-w", node, "test", "-e", path, check=False).returncode == 0

    def wipe_local_storage(self) -> None:
        """Forget every node-local image on the login side, as on a fresh node.

        Not `podman system reset`: it also deletes podman's runtime directory,
        which every podman call of the user on the node shares.
        """
        self("rmi", "--all", "--force")

    def mounts(self, node: str = "") -> list[str]:
        """The squash and overlay mounts of this storage in podman's namespace on the login side (or a node)."""
        where = ("srun", "-w", node, "podman-hpc") if node else ("podman-hpc",)
        text = self.sh(*where, "unshare", "cat", "/proc/self/mountinfo").stdout
        ours = (self.env["PODMANHPC_RUN_ROOT"], self.env["PODMANHPC_SQUASH_UNPACK_DIR"])
        mounts = [line for line in text.splitlines() if line.partition(" - ")[2].startswith(("overlay", "fuse"))]
        return [
            line
            for line in mounts
            if "squashfuse" in line or "fuse-overlayfs" in line or any(path in line for path in ours)
        ]


def make_hpc(stack: Stack, name: str, user: str = "") -> Hpc:
    """podman-hpc with private storage, as the test's user or as another stack ``user``."""
    key = uuid.uuid4().hex[:8]
    if not user:
        uid, work, env = os.getuid(), stack.work_dir(name), dict(os.environ)
    else:
        entry = pwd.getpwnam(user)
        uid, home = entry.pw_uid, entry.pw_dir
        work = stack.scratch / user / "tests" / f"{name}-{key}"
        # what dev/as-user gives that user: the stack's variables, its own home and scratch
        env = {
            k: v
            for k, v in os.environ.items()
            if k.startswith(("STACK_", "JPH_")) or k in ("PATH", "PYTHONPATH", "LANG", "SLURM_CONF", "TERM")
        }
        env.update(
            HOME=home,
            USER=user,
            LOGNAME=user,
            SCRATCH=str(stack.scratch / user),
            PYTHONPYCACHEPREFIX=f"{home}/.cache/jph-pycache",
        )
    squash_dir = work / "squash"
    env.update(
        {
            "PODMANHPC_GRAPH_ROOT": f"/tmp/{uid}_t{key}/storage",
            "PODMANHPC_RUN_ROOT": f"/tmp/{uid}_t{key}",
            "PODMANHPC_CONFIG_HOME": f"/tmp/{uid}_t{key}/config",
            "SQUASH_DIR": str(squash_dir),
            # node-local copies of squashed images (tmpfs; each node's /dev/shm is its own)
            "PODMANHPC_SQUASH_UNPACK_DIR": f"/dev/shm/{uid}_t{key}/unpacked",
        }
    )
    hpc = Hpc(stack, env, squash_dir, work, user)
    if user:
        hpc.sh("mkdir", "-p", work)
    return hpc


def cleanup_hpc(hpc: Hpc) -> None:
    """Remove the test's containers, storage and squashed store on the login side and every node."""
    root = hpc.env["PODMANHPC_RUN_ROOT"]
    # Plain `podman unshare` (podman's default storage, not the test's) joins the
    # namespace where the test storage's mounts live, without re-creating it.
    # the node-local copies (each node's tmpfs) go last, once no container uses them
    script = (
        "podman-hpc rm --all --force --time 0 >/dev/null 2>&1; "
        'podman unshare sh -c \'umount -R "$1/storage/overlay" 2>/dev/null; rm -rf "$1" "$2"\' sh "$1" "$2"'
    )
    unpack = str(hpc.unpack_dir.parent)
    hpc.sh("sh", "-c", script, "sh", root, unpack, check=False)
    # --immediate: when another job holds the nodes, leave the (private) leftovers rather than hang.
    hpc.srun(
        f"-N{len(hpc.stack.nodes)}",
        "--ntasks-per-node=1",
        "--immediate=60",
        "sh",
        "-c",
        script,
        "sh",
        root,
        unpack,
        check=False,
        timeout=180,
    )
    if hpc.user:
        hpc.sh("rm", "-rf", hpc.work, check=False)
    shutil.rmtree(hpc.work, ignore_errors=True)


def squashed_store(stack, image) -> Iterator[Hpc]:
    """A squashed store holding ``image``, that no node has locally (for a fixture to yield from);
    removed afterwards."""
    instance = make_hpc(stack, "squashed")
    instance("pull", image)
    instance.wipe_local_storage()
    yield instance
    cleanup_hpc(instance)


STORE_VARS = ("SQUASH_DIR", "PODMANHPC_GRAPH_ROOT", "PODMANHPC_RUN_ROOT", "PODMANHPC_CONFIG_HOME")


def store_env(hpc) -> dict[str, str]:
    """The variables that point a job's ranks at ``hpc``'s squashed store and storage (the spec's
    ``environment``: the batch script carries them, not the test's own environment)."""
    return {name: hpc.env[name] for name in STORE_VARS}
