"""The unpack cache's policy on the real stack (issue 21): a copy idle past
``squash_unpack_idle_minutes`` is removed at the next use and one in use never; a login
node (no SLURM_JOB_ID) does not unpack by default (and has a budget of its own when asked
to), a job does and records itself, and the
next use on the node after that job has ended releases its copy; infohpc lists the copies.

Every test has an unpack cache of its own; a node's copies are read on the node (its
/dev/shm is its own, as on a cluster)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from jupyter_podman_hpc.engine.mount.cache import cache_entries, in_use
from tests.helpers.hpc import cleanup_hpc, make_hpc

IMAGES = ("one", "two")


def image(name: str) -> str:
    return f"localhost/tests/policy-{name}:1"


@pytest.fixture(scope="module")
def store(stack):
    """A squashed store with the tiny image and two images built on it (each its own squash
    file, so its own copy); no node has them locally."""
    instance = make_hpc(stack, "unpack-policy")
    instance("pull", stack.tiny_image)
    for name in IMAGES:
        context = instance.work / f"ctx-{name}"
        context.mkdir(parents=True, exist_ok=True)
        (context / "Containerfile").write_text(f"FROM {stack.tiny_image}\nRUN echo {name} > /{name}\n")
        instance("build", "-t", image(name), context)
        instance("migrate", image(name))
    instance.wipe_local_storage()
    yield instance
    cleanup_hpc(instance)


@pytest.fixture
def policy(store, stack):
    """The store with a fresh unpack cache of this test's own."""
    unpack = f"/dev/shm/{os.getuid()}_p{uuid.uuid4().hex[:8]}/unpacked"
    hpc = dataclasses.replace(store, env={**store.env, "PODMANHPC_SQUASH_UNPACK_DIR": unpack})
    yield hpc
    remove = ("podman", "unshare", "rm", "-rf", str(Path(unpack).parent))
    hpc.sh(*remove, check=False)
    hpc.srun(f"-N{len(stack.nodes)}", "--ntasks-per-node=1", "--immediate=60", *remove, check=False, timeout=180)


def with_env(hpc, **extra: str):
    return dataclasses.replace(hpc, env={**hpc.env, **extra})


def cache_of(hpc) -> Path:
    return Path(hpc.env["PODMANHPC_SQUASH_UNPACK_DIR"])


def our_mounts(hpc, node: str = "") -> list[str]:
    """``hpc.mounts``, without other tests' squashfuse mounts (podman's namespace is the user's)."""
    ours = (hpc.env["PODMANHPC_RUN_ROOT"], hpc.env["PODMANHPC_SQUASH_UNPACK_DIR"], str(hpc.squash_dir))
    return [line for line in hpc.mounts(node) if any(path in line for path in ours)]


def wait_for(predicate, within: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_an_idle_copy_goes_at_the_next_use_and_one_in_use_never(policy, stack):
    # a login node that asked for unpacking, with copies idle after 3 s
    hpc = with_env(policy, PODMANHPC_SQUASH_READ_PATH="unpacked", PODMANHPC_SQUASH_UNPACK_IDLE_MINUTES="0.05")
    cache = cache_of(hpc)
    hpc("run", "--rm", stack.tiny_image, "true")
    [idle] = [key for key, _, _ in cache_entries(cache)]
    argv, env = hpc.command(["podman-hpc", "run", "--rm", image("one"), "sh", "-c", "sleep 25; cat /one"])
    long = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(cache_entries(cache)) == 2, what="the long container's copy was not made")
        [held] = [key for key, _, _ in cache_entries(cache) if key != idle]
        wait_for(lambda: in_use(cache, held), what="the long container does not hold its copy")
        time.sleep(4)  # both past the idle time: one unused, one in use
        assert all(time.time() - last > 3 for _, _, last in cache_entries(cache))

        assert hpc("run", "--rm", image("two"), "cat", "/two").stdout.split() == ["two"]  # the next use
        keys = {key for key, _, _ in cache_entries(cache)}
        assert idle not in keys and not (cache / idle).exists()  # removed, tree and all
        assert held in keys and in_use(cache, held)  # in use: kept

        info = hpc("infohpc").stdout
        assert "(a login node (no SLURM_JOB_ID)): budget 2048 MiB (squash_unpack_login_max_mb 2048)" in info, info
        [line] = [line for line in info.splitlines() if held in line]
        assert " MiB, in use, last used " in line and f": {hpc.squash_dir}/overlay/l/" in line, line
    finally:
        out, _ = long.communicate(timeout=120)
    assert long.returncode == 0 and out.split() == ["one"]  # its root was never taken away

    # once its container has gone, it is an idle copy like any other: infohpc removes it
    wait_for(lambda: not in_use(cache, held), what="the copy is still held after its container ended")
    time.sleep(4)
    info = hpc("infohpc").stdout
    assert f"removed unpacked copy {held}: unused for" in info, info
    assert "more than squash_unpack_idle_minutes (0.05)" in info
    assert f"unpacked copies: none in {cache}" in hpc("infohpc").stdout
    assert cache_entries(cache) == [] and our_mounts(hpc) == []


def job_of(out: str) -> str:
    return next(line.split("=", 1)[1] for line in out.splitlines() if line.startswith("job="))


def test_a_login_node_does_not_unpack_a_job_does_and_its_end_releases_the_copy(policy, stack):
    hpc = policy  # squash_read_path: auto, the default
    assert "SLURM_JOB_ID" not in hpc.env  # the host is the login node
    cache = cache_of(hpc)
    root = hpc("run", "--rm", stack.tiny_image, "grep", " / ", "/proc/mounts").stdout.splitlines()[0]
    lowers = next(o for o in root.split()[3].split(",") if o.startswith("lowerdir="))
    assert root.split()[2] == "overlay" and "/squash-mounts/" in lowers, root  # over the squashfuse mount
    assert str(cache) not in root and cache_entries(cache) == []
    info = hpc("infohpc").stdout
    assert "no unpacking on a login node (no SLURM_JOB_ID)" in info and f"unpacked copies: none in {cache}" in info

    # in a job on a compute node: unpacked, the copy says which job made it
    node = stack.nodes[1]
    script = 'echo "job=$SLURM_JOB_ID"; podman-hpc run --rm "$1" true && podman-hpc infohpc'
    out = hpc.srun("-w", node, "sh", "-c", script, "sh", stack.tiny_image).stdout
    job = job_of(out)
    assert f"unpacks into {cache} (in Slurm job {job}): budget " in out and "(squash_unpack_max_mb 10%)" in out
    [made] = hpc.unpacked(node)
    assert (made.job, made.node, made.in_use) == (job, node, False)
    assert cache_entries(cache) == []  # made on the node, not on the login node
    assert f"{made.key} " in out and f", unused, last used 0 min ago, job {job} on {node}: " in out

    # the job has ended: the next use on the node, by another job and another image, releases its copy
    wait_for(
        lambda: hpc.sh("squeue", "-h", "-j", job, "-o", "%T", check=False).stdout.strip() == "",
        what=f"job {job} is still listed",
    )
    out = hpc.srun(
        "-w", node, "sh", "-c", 'echo "job=$SLURM_JOB_ID"; podman-hpc run --rm "$1" cat /one', "sh", image("one")
    ).stdout
    later = job_of(out)
    assert out.split()[-1] == "one" and later != job
    [kept] = hpc.unpacked(node)
    assert kept.key != made.key and kept.job == later and not hpc.exists_on(node, cache / made.key)

    # or a job's last step releases its own copies at once (rootless: no epilog needed)
    out = hpc.srun(
        "-w",
        node,
        "sh",
        "-c",
        'echo "job=$SLURM_JOB_ID"; podman-hpc run --rm "$1" cat /two && podman-hpc infohpc --release-job',
        "sh",
        image("two"),
    ).stdout
    last = job_of(out)
    released = [line for line in out.splitlines() if line.endswith(f": released at the end of job {last}")]
    assert len(released) == 1 and "two" in out.split(), out
    assert [copy for copy in hpc.unpacked(node) if copy.job == last] == []
    outside = hpc("infohpc", "--release-job", check=False)
    assert outside.returncode == 125 and outside.stderr.strip() == (
        "Error: infohpc --release-job is for the last step of a Slurm job (no SLURM_JOB_ID here)"
    )
    assert our_mounts(hpc) == [] and our_mounts(hpc, node) == []
