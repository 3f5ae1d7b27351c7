"""Engine state under /dev/shm against a hostile image: out of every container's reach.

The attacker is code in the image; the victim (hpcuser) runs it as PyTorch's DataLoader and
NCCL advice has it, with ``--ipc=host``, which hands a container the host's ``/dev/shm``. The
unpacked copies of the user's squashed images live there (``/dev/shm/<uid>_hpc/unpacked``, with
the checked-file records and the squashfuse mounts), and container root is the user's uid: the
image could rewrite another image's tree, such as the kernel image's ``site.py``. Such a
container gets the user's own ``$PODMANHPC_PRIVATE_SHM`` at ``/dev/shm`` instead; a bind that
would reach the state is refused in one line with nothing started. The normal flow still works:
``--ipc=host`` containers of the user share the host's IPC namespace and their /dev/shm, and the
image runs from its unpacked copy. And a site template whose parent is everyone's
(``/dev/shm/unpacked-{{ uid }}``) keeps each user's records and mounts apart.
"""

import dataclasses
import os
import pwd
import textwrap
import uuid

import pytest

from jupyter_podman_hpc.engine.site.modules import PRIVATE_SHM

# Run inside the container: plant a file in every unpacked tree it can find, say what /dev/shm holds.
PLANT = textwrap.dedent("""\
    for tree in "$UNPACK"/*/etc /dev/shm/*/unpacked/*/etc /dev/shm/*/*/etc; do
        [ -d "$tree" ] && echo "visible: $tree"
        touch "$tree/PLANTED" 2>/dev/null && echo "planted: $tree"
    done
    echo "shm: $(ls -A /dev/shm | tr '\\n' ' ')"
    """)
ROOT_MOUNT = "awk '$5 == \"/\"' /proc/self/mountinfo"  # the container's root: its overlay and lowers


def unpacking(hpc, image: str):
    """``hpc`` with ``image`` in its squashed store only, read from unpacked copies."""
    hpc("pull", image)
    hpc.wipe_local_storage()
    hpc.env["PODMANHPC_SQUASH_READ_PATH"] = "unpacked"
    return hpc


def planted(unpack) -> list[str]:
    return [str(tree) for tree in unpack.glob("*/etc") if (tree / "PLANTED").exists()]


@pytest.fixture
def victim_unpacked(victim, stack):
    """The victim with the tiny image unpacked by a container of it, and a private shared-memory
    directory of the test's own beside its unpack cache."""
    unpacking(victim, stack.tiny_image)
    victim.env[PRIVATE_SHM] = str(victim.unpack_dir.parent / "ipc")
    root = victim("run", "--rm", stack.tiny_image, "sh", "-c", ROOT_MOUNT).stdout
    assert f"lowerdir={victim.unpack_dir}/" in root, root  # a container of the image unpacked it
    assert list(victim.unpack_dir.glob("*/etc")), "no unpacked tree to attack"
    return victim


def test_host_ipc_gives_the_image_the_users_own_shm_not_the_unpack_cache(victim_unpacked, stack):
    victim = victim_unpacked
    unpack = victim.unpack_dir
    attack = victim("run", "--rm", "--ipc=host", "-e", f"UNPACK={unpack}", stack.tiny_image, "sh", "-c", PLANT)
    lines = attack.stdout.splitlines()
    assert [line for line in lines if line.startswith(("visible", "planted"))] == [], attack.stdout
    assert planted(unpack) == []
    assert lines[-1] == "shm: ", attack.stdout  # the user's own directory, empty so far
    assert oct(os.stat(victim.env[PRIVATE_SHM]).st_mode & 0o777) == "0o700"

    # the normal flow: the host's IPC namespace, and /dev/shm shared by the user's --ipc=host containers
    writer = victim(
        "run",
        "--rm",
        "--ipc",
        "host",
        stack.tiny_image,
        "sh",
        "-c",
        f"readlink /proc/self/ns/ipc; echo segment > /dev/shm/jph-seg; {ROOT_MOUNT}",
    )
    namespace, root = writer.stdout.split("\n", 1)
    assert namespace == os.readlink("/proc/self/ns/ipc")
    assert f"lowerdir={unpack}/" in root, root  # still run from the unpacked copy
    reader = victim("run", "--rm", "--ipc=host", stack.tiny_image, "cat", "/dev/shm/jph-seg")
    assert reader.stdout == "segment\n"
    assert open(os.path.join(victim.env[PRIVATE_SHM], "jph-seg")).read() == "segment\n"

    # a Containerfile's RUN steps, built with --ipc=host (podman-hpc build), are kept out the same way
    context = victim.work / "build"
    context.mkdir()
    (context / "plant.sh").write_text(PLANT)
    (context / "Containerfile").write_text(
        f"FROM {stack.tiny_image}\nCOPY plant.sh /\nRUN UNPACK={unpack} sh /plant.sh\n"
    )
    built = victim("build", "--ipc=host", "-t", f"localhost/jph-shm-{uuid.uuid4().hex[:8]}", context)
    assert "planted: " not in built.stdout + built.stderr and "visible: " not in built.stdout + built.stderr
    assert "shm: jph-seg" in built.stdout + built.stderr  # the user's own /dev/shm
    assert planted(unpack) == []


# binds whose host source is, contains or lies inside the engine's state ({shm}: the unpack cache's parent)
STATE_BINDS = [
    ["-v", "/dev/shm:/dev/shm"],
    ["-v", "/dev:/dev"],
    ["--volume", "{shm}:/x"],
    ["--mount", "type=bind,src=/dev/shm,dst=/mnt"],
    ["-v", "/tmp:/tmp"],
]


def test_a_bind_that_reaches_engine_state_is_refused_in_one_line_with_nothing_started(victim_unpacked, stack):
    victim = victim_unpacked
    name = f"jph-shm-{uuid.uuid4().hex[:8]}"
    for bind in STATE_BINDS:
        bind = [word.format(shm=victim.unpack_dir.parent) for word in bind]
        attack = victim(
            "run",
            "--rm",
            "--name",
            name,
            *bind,
            "-e",
            f"UNPACK={victim.unpack_dir}",
            stack.tiny_image,
            "sh",
            "-c",
            PLANT,
            check=False,
        )
        assert attack.returncode == 125, attack.stdout + attack.stderr
        assert attack.stdout == ""
        lines = attack.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"Error: {' '.join(bind)} would give the container podman-hpc's own state ("
        ), attack.stderr
        assert lines[0].endswith(
            "bind a directory of your own (--ipc=host alone shares /dev/shm between your containers)"
        )
    assert victim("ps", "-a", "--filter", f"name={name}", "--format", "{{.Names}}").stdout == ""
    assert planted(victim.unpack_dir) == []
    # the normal flow: a directory of one's own is bound as asked
    own = victim.work / "data"
    own.mkdir()
    victim("run", "--rm", "-v", f"{own}:/data", stack.tiny_image, "sh", "-c", "echo ok > /data/out")
    assert (own / "out").read_text() == "ok\n"


def test_a_shared_run_step_is_refused_the_same_way(victim_unpacked, stack):
    victim = victim_unpacked
    step = victim.srun(
        "-N1",
        "-n1",
        "podman-hpc",
        "shared-run",
        "-v",
        "/dev/shm:/dev/shm",
        "-e",
        f"UNPACK={victim.unpack_dir}",
        stack.tiny_image,
        "sh",
        "-c",
        PLANT,
        check=False,
    )
    assert step.returncode != 0
    assert "Error: -v /dev/shm:/dev/shm would give the container podman-hpc's own state (" in step.stderr
    assert planted(victim.unpack_dir) == []
    assert victim.leftovers() == {}


def test_a_site_unpack_template_below_everyones_shm_keeps_each_users_state_apart(victim, member, stack):
    # squash_unpack_dir: /dev/shm/unpacked-{{ uid }} (a test-only name, so nothing else meets it)
    template = f"/dev/shm/unpacked-jph{uuid.uuid4().hex[:6]}-{{{{ uid }}}}"
    users = []
    for hpc in (victim, member):
        unpacking(hpc, stack.tiny_image)
        env = {k: v for k, v in hpc.env.items() if k != "PODMANHPC_SQUASH_UNPACK_DIR"}
        env["PODMANHPC_SQUASH_UNPACK_DIR_TEMPLATE"] = template
        uid = pwd.getpwnam(hpc.user).pw_uid if hpc.user else os.getuid()
        users.append((dataclasses.replace(hpc, env=env), template.replace("{{ uid }}", str(uid))))
    try:
        # the victim first: the layout before made /dev/shm/squash-verified the victim's, and refused the member
        for hpc, unpack in users:
            root = hpc("run", "--rm", stack.tiny_image, "sh", "-c", ROOT_MOUNT).stdout
            assert f"lowerdir={unpack}/" in root, root
        for hpc, unpack in users:  # each squash file checked, and remembered in the user's own directory
            assert hpc.sh("ls", "-A", f"{unpack}/squash-verified").stdout.split()
        assert not any(os.path.exists(f"/dev/shm/{name}") for name in ("squash-verified", "squash-mounts"))
    finally:
        for hpc, unpack in users:
            hpc.sh("podman", "unshare", "rm", "-rf", unpack, check=False)
