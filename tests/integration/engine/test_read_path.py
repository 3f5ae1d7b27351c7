"""The read path of squashed images on the real stack: each mode on a node that never
pulled the image, copy-up into the container's root, fallbacks, and no leaks after
killed containers or many containers of several images; in the login-node flow (pulled
on the host, so local and squashed), the unpacked squashed copy is what containers read,
and an image built on top of it keeps its own layers."""

import dataclasses
import os
import subprocess
import time
from pathlib import Path

import pytest

from jupyter_podman_hpc.engine.mount.cache import cache_entries, in_use

# What the container's root is, by read path: (file system type, what its lower is).
ROOTS = {
    "unpacked": ("overlay", "unpacked"),
    "kernel": ("overlay", "/squash-mounts/"),
    "fuse": ("fuse.fuse-overlayfs", ""),
}


def with_read_path(hpc, mode: str, **extra: str):
    return dataclasses.replace(hpc, env={**hpc.env, "PODMANHPC_SQUASH_READ_PATH": mode, **extra})


def root_mount(hpc, image: str, node: str) -> str:
    """The container root's /proc/mounts line, from a container run on ``node``."""
    out = hpc.srun("-w", node, "podman-hpc", "run", "--rm", image, "sh", "-c", "grep ' / ' /proc/mounts").stdout
    return out.strip().splitlines()[0]


@pytest.mark.parametrize("mode", ["unpacked", "kernel", "fuse"])
def test_each_read_path_runs_the_image_and_copies_up_writes(squashed_tiny, stack, mode):
    hpc = with_read_path(squashed_tiny, mode)
    node = stack.nodes[1]
    fstype, lower = ROOTS[mode]
    line = root_mount(hpc, stack.tiny_image, node)
    assert line.split()[2] == fstype, line
    assert lower in line, line
    script = (
        "echo changed >> /etc/os-release && tail -1 /etc/os-release && echo new > /new && cat /new && "
        "rm /bin/true && test ! -e /bin/true && echo removed && stat -c %u /bin"
    )
    out = hpc.srun("-w", node, "podman-hpc", "run", "--rm", stack.tiny_image, "sh", "-c", script).stdout.split()
    assert out == ["changed", "new", "removed", "0"]
    # the image itself is untouched for the next container
    again = hpc.srun(
        "-w",
        node,
        "podman-hpc",
        "run",
        "--rm",
        stack.tiny_image,
        "sh",
        "-c",
        "grep -c changed /etc/os-release; test -e /bin/true && echo kept",
        check=False,
    ).stdout.split()
    assert again == ["0", "kept"]
    assert hpc.mounts(node) == []


def test_an_image_over_the_unpack_budget_falls_back_to_squashfuse_and_says_so(squashed_tiny, stack):
    hpc = with_read_path(squashed_tiny, "auto", PODMANHPC_SQUASH_UNPACK_MAX_MB="0.01")
    node = stack.nodes[2]
    line = root_mount(hpc, stack.tiny_image, node)
    assert line.split()[2] == "overlay" and "/squash-mounts/" in line, line  # kernel overlay over squashfuse
    info = hpc.srun("-w", node, "podman-hpc", "infohpc").stdout
    assert "no unpacked copy, squashfuse instead" in info and "squash_unpack_max_mb" in info
    assert hpc.mounts(node) == []


def test_auto_reads_through_squashfuse_what_the_jobs_nodes_together_would_read_too_much_of(squashed_tiny, stack):
    """Each node unpacks the whole squash file: a 2-node job's nodes would read 2x its size from the
    shared store, past a limit of 1.5x; a 1-node job's stay within it."""
    squash = next(Path(squashed_tiny.env["SQUASH_DIR"]).glob("overlay/l/*.squash"))
    limit = f"{1.5 * squash.stat().st_size / 2**20:.3f}"
    hpc = with_read_path(squashed_tiny, "auto", PODMANHPC_SQUASH_UNPACK_AUTO_JOB_MAX_MB=limit)
    roots = (
        hpc.srun(
            "-N2",
            "--ntasks-per-node=1",
            "podman-hpc",
            "run",
            "--rm",
            stack.tiny_image,
            "sh",
            "-c",
            "grep ' / ' /proc/mounts",
        )
        .stdout.strip()
        .splitlines()
    )
    assert len(roots) == 2 and all("/squash-mounts/" in line for line in roots), roots
    info = hpc.srun("-w", stack.nodes[0], "podman-hpc", "infohpc").stdout
    assert "auto reads it through squashfuse: 2 nodes x" in info and "squash_unpack_auto_job_max_mb" in info
    assert "unpacked" in root_mount(hpc, stack.tiny_image, stack.nodes[0])  # one node: within the limit
    assert hpc.mounts(stack.nodes[0]) == [] and hpc.mounts(stack.nodes[1]) == []


def test_where_kernel_overlayfs_is_refused_the_mount_program_uses_fuse_overlayfs(squashed_tiny, tmp_path):
    """Outside a user namespace the kernel refuses an unprivileged overlay mount (EPERM),
    as an old kernel or a locked-down node does: the mount program must still mount."""
    hpc = squashed_tiny
    link = next((hpc.squash_dir / "overlay" / "l").glob("*.squash")).with_suffix("")
    layer = tmp_path / "overlay" / "c0ffee"
    for name in ("diff", "work", "merged"):
        (layer / name).mkdir(parents=True)
    env = {**hpc.env, "PODMANHPC_SQUASH_READ_PATH": "auto", "PODMANHPC_SQUASH_UNPACK_DIR": str(tmp_path / "unpacked")}
    merged = layer / "merged"
    subprocess.run(
        ["podman-hpc-mount", "-o", f"lowerdir={link},upperdir={layer}/diff,workdir={layer}/work", str(merged)],
        env=env,
        check=True,
        timeout=60,
    )
    try:
        assert "tiny" in (merged / "etc" / "os-release").read_text()
        with open("/proc/self/mountinfo") as mountinfo:
            assert any(f" {merged} " in line and "fuse-overlayfs" in line for line in mountinfo)
        notes = (tmp_path / "squash-mounts" / "read-path.log").read_text()
        assert "kernel overlayfs refused" in notes and "fuse-overlayfs instead" in notes
        assert in_use(tmp_path / "unpacked", cache_entries(tmp_path / "unpacked")[0][0])
    finally:
        subprocess.run(["fusermount3", "-u", str(merged)], check=True)
    deadline = time.monotonic() + 10
    while in_use(tmp_path / "unpacked", cache_entries(tmp_path / "unpacked")[0][0]):
        assert time.monotonic() < deadline, "the watcher did not release the copy after the unmount"
        time.sleep(0.1)


def watchers(hpc, node: str) -> list[str]:
    """Mount-program watchers of this test's storage still running on ``node``."""
    pattern = f"[p]odman-hpc-mount.*{hpc.env['PODMANHPC_RUN_ROOT']}/"  # [p]: not this pgrep's own shell
    return hpc.srun("-w", node, "sh", "-c", 'pgrep -u "$(id -u)" -f "$1" || true', "sh", pattern).stdout.split()


# On the node, in one step (nodes are allocated whole): start a container, SIGKILL its
# podman and conmon once its root is mounted, then remove it as the next podman call would.
KILL_SCRIPT = """
podman-hpc run --rm --name "$1" "$2" sleep 60 &
for i in $(seq 120); do podman-hpc unshare grep -q "$3" /proc/self/mountinfo && break; sleep 0.5; done
echo started
pkill -KILL -f -- "--name $1"; pkill -KILL -f -- "-n $1"
podman-hpc rm --force --ignore --time 0 "$1" >/dev/null
"""


def test_killed_podman_and_container_leave_no_mount_or_watcher(squashed_tiny, stack):
    hpc = with_read_path(squashed_tiny, "unpacked")
    node = stack.nodes[0]
    out = hpc.srun(
        "-w", node, "sh", "-c", KILL_SCRIPT, "sh", f"killed-{os.getpid()}", stack.tiny_image, str(hpc.unpack_dir)
    ).stdout
    assert "started" in out
    deadline = time.monotonic() + 30
    while hpc.mounts(node) or watchers(hpc, node):
        assert time.monotonic() < deadline, (hpc.mounts(node), watchers(hpc, node))
        time.sleep(1)
    assert [copy.in_use for copy in hpc.unpacked(node)] == [False]
    # conmon killed under a runc init that waited for its start: the task's reaper ends that too
    assert hpc.leftovers(within=15) == {}


def test_fifty_containers_of_three_images_leave_nothing(hpc, stack):
    hpc = with_read_path(hpc, "auto")
    node = stack.nodes[3]
    hpc("pull", stack.base_image)
    hpc("pull", stack.tiny_image)
    context = hpc.work / "ctx-third"
    context.mkdir(parents=True, exist_ok=True)
    (context / "Containerfile").write_text(f"FROM {stack.tiny_image}\nRUN echo third > /third\n")
    hpc("build", "-t", "localhost/tests/third:1", context)
    hpc("migrate", "localhost/tests/third:1")
    hpc.wipe_local_storage()
    images = [stack.base_image, stack.tiny_image, "localhost/tests/third:1"]
    script = (
        'n=0; for image in "$@"; do podman-hpc run --rm "$image" true & n=$((n+1)); '
        "[ $((n % 5)) -eq 0 ] && wait; done; wait"
    )
    hpc.srun("-w", node, "sh", "-c", script, "sh", *(images * 17)[:50], timeout=900)
    assert hpc.mounts(node) == []
    assert watchers(hpc, node) == []
    copies = hpc.unpacked(node)
    # each image's copy, none held; if one is missing, what the mount program fell back to and why
    # (infohpc's read-path lines only: pytest cuts a long message before its end)
    info = hpc.srun("-w", node, "podman-hpc", "infohpc", check=False).stdout.splitlines()
    assert len(copies) == 3 and not any(copy.in_use for copy in copies), (
        [(copy.squash, copy.in_use) for copy in copies],
        [line for line in info if "unpack" in line or "fell back" in line],
    )


# --- the login-node flow: an image pulled (local AND squashed) or built on the host -------

ROOT_AND_FILES = (
    "grep ' / ' /proc/mounts; head -1 /etc/os-release; test -e /bin/true && echo has-true; cat /added 2>/dev/null; true"
)


def mounts_within(hpc, seconds: float = 15) -> list[str]:
    """The storage's mounts left once conmon's clean-up of the last containers has had time to run."""
    deadline = time.monotonic() + seconds
    while hpc.mounts() and time.monotonic() < deadline:
        time.sleep(0.5)
    return hpc.mounts()


def test_a_pulled_image_is_read_from_its_unpacked_copy_and_one_built_on_it_keeps_its_layers(hpc, stack):
    hpc = with_read_path(hpc, "unpacked")
    hpc("pull", stack.tiny_image)  # podman-hpc pull: into the local storage, then squashed
    assert "local + squashed" in hpc("images").stdout
    out = hpc("run", "--rm", stack.tiny_image, "sh", "-c", ROOT_AND_FILES).stdout.splitlines()
    # kernel overlayfs over the unpacked squash file, not fuse-overlayfs over the local layers
    assert out[0].split()[2] == "overlay" and hpc.env["PODMANHPC_SQUASH_UNPACK_DIR"] in out[0], out[0]
    assert out[1:] == ['NAME="jph tiny"', "has-true"]  # the image's files
    # --userns keep-id (id mappings: fuse-overlayfs only) keeps the local layers, and runs
    out = hpc("run", "--rm", "--userns", "keep-id", stack.tiny_image, "sh", "-c", ROOT_AND_FILES).stdout.splitlines()
    assert out[0].split()[2] == "fuse.fuse-overlayfs" and out[1:] == ['NAME="jph tiny"', "has-true"], out

    # an image built FROM the squashed one (on top of its layer) keeps its own layers: a deleted file
    # stays deleted, an added one is there
    context = hpc.work / "ctx-built"
    context.mkdir(parents=True, exist_ok=True)
    (context / "Containerfile").write_text(f"FROM {stack.tiny_image}\nRUN rm /bin/true && echo added > /added\n")
    hpc("build", "-t", "localhost/tests/built-on-squashed:1", context)
    out = hpc("run", "--rm", "localhost/tests/built-on-squashed:1", "sh", "-c", ROOT_AND_FILES).stdout.splitlines()
    assert out[0].split()[2] == "fuse.fuse-overlayfs", out[0]
    assert out[1:] == ['NAME="jph tiny"', "added"]
    # and once squashed itself, it is read from its own squash file, with the same files
    hpc("migrate", "localhost/tests/built-on-squashed:1")
    out = hpc("run", "--rm", "localhost/tests/built-on-squashed:1", "sh", "-c", ROOT_AND_FILES).stdout.splitlines()
    assert out[0].split()[2] == "overlay" and hpc.env["PODMANHPC_SQUASH_UNPACK_DIR"] in out[0], out[0]
    assert out[1:] == ['NAME="jph tiny"', "added"]
    assert mounts_within(hpc) == []


def test_auto_reads_a_pulled_image_unpacked_in_a_job_and_from_its_local_layers_on_the_login_node(hpc, stack):
    """On a login node auto does not unpack, and squashfuse reads no faster than fuse-overlayfs over
    the local layers: those stay (no squashfuse mount per container). In a job, the unpacked copy."""
    hpc = with_read_path(hpc, "auto")
    hpc("pull", stack.tiny_image)
    out = hpc("run", "--rm", stack.tiny_image, "sh", "-c", ROOT_AND_FILES).stdout.splitlines()
    assert out[0].split()[2] == "fuse.fuse-overlayfs" and out[1:] == ['NAME="jph tiny"', "has-true"], out
    node = stack.nodes[1]
    script = 'podman-hpc pull -q "$1" >/dev/null && podman-hpc run --rm "$1" sh -c "$2"'
    out = hpc.srun("-w", node, "sh", "-c", script, "sh", stack.tiny_image, ROOT_AND_FILES).stdout.splitlines()
    assert out[0].split()[2] == "overlay" and hpc.env["PODMANHPC_SQUASH_UNPACK_DIR"] in out[0], out[0]
    assert out[1:] == ['NAME="jph tiny"', "has-true"]
    assert mounts_within(hpc) == [] and hpc.mounts(node) == []


def test_a_changed_squash_file_is_refused_even_for_the_locally_pulled_image(hpc, stack):
    hpc = with_read_path(hpc, "unpacked")
    hpc("pull", stack.tiny_image)
    hpc("run", "--rm", stack.tiny_image, "true")  # checked and unpacked once
    squash = next((hpc.squash_dir / "overlay" / "l").glob("*.squash"))
    with open(squash, "r+b") as out:  # rewritten after it was squashed
        out.seek(100)
        byte = out.read(1)
        out.seek(100)
        out.write(bytes([byte[0] ^ 0xFF]))
    result = hpc("run", "--rm", stack.tiny_image, "echo", "ran", check=False)
    assert result.returncode != 0 and "ran" not in result.stdout
    assert f"squash file {squash} does not match its record" in result.stderr, result.stderr
    assert mounts_within(hpc) == []
