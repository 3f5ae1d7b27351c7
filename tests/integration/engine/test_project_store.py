"""Project stores on the real stack: one member squashes an image into a store the project
group shares, another member lists and runs it (per process and podman-exec on 4 nodes, as a
kernel), a user outside the group is refused in one line, and two members write it safely.

The test's user (the stack user) is member A; member B and the outsider are the stack's
other users, reached through its sudo rule (``Hpc.user``).
"""

import dataclasses
import json
import os
import signal
import stat
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.helpers.commands import run
from tests.helpers.hpc import cleanup_hpc, make_hpc
from tests.helpers.peer import peer_env


def project_dir() -> Path:
    path = os.environ.get("STACK_PROJECT_DIR")
    if not path:
        pytest.fail("the stack exports no STACK_PROJECT_DIR: run `dev/stack up`")
    return Path(path)


@pytest.fixture
def store():
    """A fresh project store, made by A as a member would: a directory in the project's."""
    path = project_dir() / f"store-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    path.chmod(0o2770)  # members write it too (the default this project documents)
    yield path
    # B removes what B wrote (new directories are sticky: only a file's owner removes it), then A
    run(["sudo", "-n", "-u", os.environ["STACK_USER2"], "rm", "-rf", str(path)], check=False)
    run(["rm", "-rf", str(path)], check=False)


def member(stack, name, user, store):
    hpc = make_hpc(stack, name, user)
    hpc.env["PODMANHPC_ADDITIONAL_STORES"] = str(store)
    return hpc


@pytest.fixture
def b(stack, store):
    """Member B: its own personal store and node storage, the project store as an additional one."""
    hpc = member(stack, "member-b", os.environ["STACK_USER2"], store)
    yield hpc
    cleanup_hpc(hpc)


@pytest.fixture
def outsider(stack, store):
    hpc = member(stack, "outsider", os.environ["STACK_OUTSIDER"], store)
    yield hpc
    cleanup_hpc(hpc)


def build(hpc, tag, containerfile):
    context = hpc.work / f"ctx-{uuid.uuid4().hex[:6]}"
    hpc.sh("mkdir", "-p", context)
    hpc.sh("sh", "-c", 'cat > "$1/Containerfile"', "sh", context, input=containerfile)
    hpc("build", "-t", tag, context)
    return tag


OWNED = """\
FROM {tiny}
RUN mkdir -p /data && echo secret > /data/f && chown -R 1000:1000 /data && chmod 700 /data && chmod 600 /data/f
"""
# owners and modes inside the container: root's files stay root's, the image user's stay its own
CHECK = "stat -c '%u:%g:%a' /etc/os-release /data /data/f"
EXPECTED = "0:0:644 1000:1000:700 1000:1000:600"


def squash_files(store):
    return sorted((store / "overlay" / "l").glob("*.squash"))


def test_a_migrates_b_lists_and_runs_it_on_four_nodes(hpc, b, store, stack):
    tag = build(hpc, f"localhost/tests/project:{uuid.uuid4().hex[:6]}", OWNED.format(tiny=stack.tiny_image))
    hpc("--squash-dir", store, "migrate", tag)
    # group-readable (and, in this store, group-writable), closed to others, setgid directories
    for path in [store, *store.rglob("*")]:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            continue
        assert st.st_gid == store.stat().st_gid and not st.st_mode & 0o007, (path, oct(st.st_mode))
        # squash files are written once, by their maker: the group reads them
        expected = 0o040 if path.suffix == ".squash" else 0o060
        assert st.st_mode & 0o060 == expected, (path, oct(st.st_mode))
        if stat.S_ISDIR(st.st_mode):
            assert st.st_mode & stat.S_ISGID, path

    listing = b("images").stdout
    row = next(line for line in listing.splitlines() if line.startswith(tag))
    assert row.endswith(f"squashed in {store}"), listing
    # B has no copy: nothing in its node-local storage, nothing in its personal store
    assert b("images", "--format", "{{.Id}} {{.ReadOnly}}").stdout.split() == [
        hpc("images", "--format", "{{.Id}}", tag).stdout.strip(),
        "true",
    ]
    assert not list(Path(b.squash_dir).glob("overlay/l/*.squash"))

    per_process = b.srun(
        f"-N{len(stack.nodes)}",
        "--ntasks-per-node=1",
        "--label",
        "podman-hpc",
        "run",
        "--rm",
        "--user",
        "0",
        tag,
        "sh",
        "-c",
        f"{CHECK} | tr '\\n' ' '; id -u; cat /data/f",
    ).stdout
    assert per_process.count(EXPECTED) == len(stack.nodes), per_process
    assert per_process.count("secret") == len(stack.nodes), per_process
    shared = b.srun(
        f"-N{len(stack.nodes)}",
        "--ntasks-per-node=2",
        "podman-hpc",
        "shared-run",
        tag,
        "sh",
        "-c",
        f"{CHECK} | tr '\\n' ' '; echo",
    ).stdout
    assert shared.count(EXPECTED) == 2 * len(stack.nodes), shared
    # the image's own user reads its private file, whoever squashed it
    assert b("run", "--rm", "--user", "1000", tag, "cat", "/data/f").stdout.strip() == "secret"


def test_an_outsider_is_refused_in_one_line_naming_the_store(hpc, outsider, store, stack):
    hpc("--squash-dir", store, "pull", stack.tiny_image)
    group = os.environ["STACK_PROJECT_GROUP"]
    for args in (["images"], ["run", "--rm", stack.tiny_image, "true"]):
        refused = outsider(*args, check=False)
        assert refused.returncode == 125, refused
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1, refused.stderr
        assert (
            lines[0].startswith(f"Error: cannot read the image store {store}: ")
            and f"{outsider.user} is not a member of group {group}" in lines[0]
        ), lines[0]
    # and nothing was pulled instead
    assert (
        outsider.sh(
            "podman",
            "--root",
            outsider.env["PODMANHPC_GRAPH_ROOT"],
            "--runroot",
            outsider.env["PODMANHPC_RUN_ROOT"],
            "images",
            "-q",
        ).stdout.strip()
        == ""
    )


def test_a_read_only_project_store_refuses_writes_of_other_members(hpc, b, store, stack):
    hpc("--squash-dir", store, "pull", stack.tiny_image)
    store.chmod(0o2750)  # the owner alone writes; members read
    assert b("run", "--rm", stack.tiny_image, "cat", "/etc/os-release").returncode == 0
    b("pull", "--quiet", stack.tiny_image, check=False)  # into B's node storage
    refused = b("--squash-dir", store, "migrate", stack.tiny_image, check=False)
    assert refused.returncode == 125
    assert refused.stderr.strip().splitlines() == [
        f"Error: cannot write to the image store {store}: {store} is {hpc.stack.user}:"
        f"{os.environ['STACK_PROJECT_GROUP']} drwxr-s---: only its owner {hpc.stack.user} may write to it"
    ]
    assert "read-only, project store" in b("infohpc").stdout


def test_concurrent_migrations_by_two_members_give_one_squash_file(hpc, b, store, stack):
    tag = f"{stack.registry}/tests/two-members:{uuid.uuid4().hex[:6]}"
    build(hpc, tag, f"FROM {stack.tiny_image}\nRUN head -c 30000000 /dev/urandom > /blob && echo ok > /ok\n")
    hpc("push", tag)
    try:
        argv = ["podman-hpc", "--squash-dir", str(store), "pull", tag]
        processes = []
        for who in (hpc, b):
            command, env = who.command(argv)
            processes.append(
                subprocess.Popen(command, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            )
        for process in processes:
            out, err = process.communicate(timeout=600)
            assert process.returncode == 0, err
            assert "squashed" in out
        assert len(squash_files(store)) == 1
        records = json.loads((store / "overlay-images" / "images.json").read_text())
        assert [r["names"] for r in records] == [[tag]]
        b.wipe_local_storage()
        assert b("run", "--rm", tag, "cat", "/ok").stdout.strip() == "ok"
    finally:
        run(["skopeo", "delete", "--tls-verify=false", f"docker://{tag}"], check=False)


def test_a_killed_migrate_by_a_leaves_b_s_view_usable(hpc, b, store, stack):
    hpc("--squash-dir", store, "pull", stack.tiny_image)
    tag = build(
        hpc,
        "localhost/tests/project-killed:1",
        f"""\
FROM {stack.tiny_image}
RUN head -c 80000000 /dev/urandom > /blob
""",
    )
    interrupted = 0
    for delay in (0.2, 0.5, 0.9):
        process = subprocess.Popen(
            ["podman-hpc", "--squash-dir", str(store), "migrate", tag],
            env=hpc.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait()
        hpc(
            "unshare",
            "podman",
            "--root",
            hpc.env["PODMANHPC_GRAPH_ROOT"],
            "--runroot",
            hpc.env["PODMANHPC_RUN_ROOT"],
            "image",
            "unmount",
            "--all",
            "--force",
            check=False,
        )
        listing = b("images").stdout
        if tag in listing:  # finished before the kill
            break
        interrupted += 1
        assert stack.tiny_image in listing
        assert "tiny" in b("run", "--rm", stack.tiny_image, "cat", "/etc/os-release").stdout
    assert interrupted >= 1, "the kills came too late to interrupt the migration"
    hpc("--squash-dir", store, "migrate", tag)
    assert b("run", "--rm", tag, "test", "-s", "/blob").returncode == 0


def test_personal_store_comes_first_and_its_skeletons_hide_nothing(hpc, b, store, stack):
    """Precedence of names, and upstream #172: B's personal store holds an empty skeleton of
    the tiny image's layer (the parent of an image B squashed itself); the project store
    holds the tiny image whole. B still runs the project's tiny image."""
    hpc("--squash-dir", store, "pull", stack.tiny_image)
    tag = "localhost/tests/precedence:1"
    build(hpc, tag, f"FROM {stack.tiny_image}\nRUN echo project > /who\n")
    hpc("--squash-dir", store, "migrate", tag)
    build(b, tag, f"FROM {stack.tiny_image}\nRUN echo personal > /who\n")
    b("migrate", tag)  # into B's personal store: the tiny layer comes along as a skeleton
    b.wipe_local_storage()

    rows = [line for line in b("images").stdout.splitlines() if line.startswith(tag)]
    assert len(rows) == 2, rows
    assert any(r.endswith("squashed") for r in rows), rows
    assert any(r.endswith(f"squashed in {store} (shadowed)") for r in rows), rows
    assert b("run", "--rm", tag, "cat", "/who").stdout.strip() == "personal"
    info = b("infohpc").stdout
    assert info.index(f"personal: {b.squash_dir}") < info.index(f"additional: {store}")

    tiny_layer = json.loads((store / "overlay-images" / "images.json").read_text())
    tiny_layer = next(r["layer"] for r in tiny_layer if stack.tiny_image in r["names"])
    assert b.sh("test", "-d", f"{b.squash_dir}/overlay/{tiny_layer}/diff").returncode == 0
    assert "tiny" in b("run", "--rm", stack.tiny_image, "cat", "/etc/os-release").stdout


KERNEL = """\
import os, sys
from jupyter_client.manager import start_new_kernel
from jupyter_podman_hpc.kernels import kernelspec
kernelspec.install(sys.argv[1], name="project", prefix=sys.argv[2])
km, kc = start_new_kernel(kernel_name="project", startup_timeout=120, cwd=sys.argv[3])
try:
    def show(msg):
        if msg["msg_type"] == "stream":
            print(msg["content"]["text"], end="")
    code = "import os; print('ran', open('/etc/os-release').read().split()[0], os.getuid())"
    reply = kc.execute_interactive(code, timeout=60, output_hook=show)
    print("status", reply["content"]["status"])
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=True)
"""


def test_b_s_kernel_from_a_project_image_runs_code(hpc, b, store, stack):
    hpc("--squash-dir", store, "pull", stack.base_image)
    jupyter = b.work / "jupyter"
    b.env.update(
        JUPYTER_PATH=f"{jupyter}/prefix/share/jupyter",
        JUPYTER_DATA_DIR=f"{jupyter}/data",
        JUPYTER_RUNTIME_DIR=f"{jupyter}/runtime",
        JUPYTER_CONFIG_DIR=f"{jupyter}/config",
        JUPYTER_PLATFORM_DIRS="0",
    )
    out = b.sh("python", "-c", KERNEL, stack.base_image, f"{jupyter}/prefix", b.work, timeout=300).stdout
    assert 'ran PRETTY_NAME="Debian 0' in out and "status ok" in out, out
    assert b("ps", "--all", "--format", "{{.Names}}").stdout.strip() == ""  # the kernel's container is gone


def test_project_stores_and_podman_hpc_1_2_2_across_members(hpc, b, store, stack, peer, peer_home):
    # ours writes, B runs it with 1.2.2
    hpc("--squash-dir", store, "pull", stack.tiny_image)
    b_peer = dataclasses.replace(
        b,
        env={
            **b.env,
            "PODMANHPC_CONFIG_FILE": str(peer.config),
            "PATH": f"{peer.venv}/bin:{b.env['PATH']}:/usr/bin:/usr/sbin",
        },
    )
    out = b_peer.sh(
        peer.bin,
        "--squash-dir",
        b.work / "peer-squash",
        "run",
        "--rm",
        "--network",
        "host",
        stack.tiny_image,
        "cat",
        "/etc/os-release",
    ).stdout
    assert "ID=tiny" in out

    # 1.2.2 writes (its image records private to A), B's podman-hpc says so, then runs it once A shares them
    peer_store = project_dir() / f"peer-{uuid.uuid4().hex[:8]}"
    peer_store.mkdir()
    peer_store.chmod(0o2770)
    try:
        run([peer.bin, "--squash-dir", peer_store, "pull", stack.tiny_image], env=peer_env(peer, peer_home))
        b.env["PODMANHPC_ADDITIONAL_STORES"] = str(peer_store)
        refused = b("run", "--rm", stack.tiny_image, "true", check=False)
        assert refused.returncode == 125 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert f"cannot read the image store {peer_store}: " in refused.stderr
        assert f"chmod -R g+rX {peer_store}" in refused.stderr
        run(["chmod", "-R", "g+rX", peer_store])
        assert "ID=tiny" in b("run", "--rm", stack.tiny_image, "cat", "/etc/os-release").stdout
    finally:
        run(["rm", "-rf", peer_store], check=False)
