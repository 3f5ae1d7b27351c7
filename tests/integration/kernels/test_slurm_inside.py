"""Slurm from inside a container kernel (the `slurm` site module, on by default):
`srun -N2` and a 2-node `sbatch` from a cell against the stack's cluster, the
job's output at the same path inside and out; a kernelspec that opts out has
no Slurm.

The login-node flow (issue 21): the image pulled on the host where the
kernel starts, so in node-local storage and run with --userns=keep-id (a
user namespace nested in podman's rootless one): `srun -N2` and `squeue
--me` from a cell. Then the uid shim in every user-namespace layout through
`podman-hpc run --slurm`: the container's root is the user, keep-id, an
automatic namespace that maps the user, a namespace made inside each of the
first two; and plain --userns=auto, where no uid is the user's on the host,
refused (munge vouches for a subordinate uid) with a one-line hint."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import textwrap

import pytest

from jupyter_podman_hpc.engine.site import hostslurm as slurm
from tests.helpers.commands import run as run_command
from tests.helpers.hpc import cleanup_hpc, make_hpc
from tests.helpers.kernel_clients import run, start
from tests.helpers.kernel_site import KernelSite, remove_kernel_containers, site_env, use_env

pytestmark = pytest.mark.slow


@pytest.fixture
def shared_cwd(stack):
    """A working directory every node sees (the nodes have private /tmp directories)."""
    path = stack.work_dir("kernel-slurm")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_srun_and_sbatch_from_a_container_kernel(kernel_site, stack, shared_cwd):
    kernel_site.install(stack.base_image, "slurm-in")
    km, kc, _ = start("slurm-in", cwd=str(shared_cwd))
    job_id = ""
    try:
        reply, out = run(
            kc,
            textwrap.dedent("""\
            import subprocess
            step = subprocess.run(["srun", "-N2", "sh", "-c", "echo node=$SLURMD_NODENAME"],
                                  capture_output=True, text=True, timeout=120)
            print(step.returncode, step.stdout, step.stderr)
            """),
            timeout=150,
        )
        assert reply["status"] == "ok", reply
        nodes = {line.split("=", 1)[1] for line in out.split() if line.startswith("node=")}
        assert out.startswith("0 ") and len(nodes) == 2 and nodes <= set(stack.nodes), out

        reply, out = run(
            kc,
            textwrap.dedent("""\
            import os, pathlib, subprocess
            pathlib.Path("job.sh").write_text("#!/bin/sh\\nsrun sh -c 'echo ran on $SLURMD_NODENAME'\\n")
            submitted = subprocess.run(["sbatch", "--parsable", "-N2", "-o", "job.out", "job.sh"],
                                       capture_output=True, text=True, timeout=60)
            print("id", submitted.stdout.strip().split(";")[0], submitted.stderr.strip())
            """),
            timeout=90,
        )
        assert reply["status"] == "ok", reply
        job_id = out.split()[1]
        assert job_id.isdigit(), out
        reply, out = run(
            kc,
            textwrap.dedent(f"""\
            import subprocess, time
            for _ in range(240):
                state = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "State,ExitCode", "-j", "{job_id}"],
                                       capture_output=True, text=True).stdout.strip()
                if state.startswith(("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")):
                    break
                time.sleep(0.5)
            print("state", state)
            print(open("job.out").read())
            """),
            timeout=150,
        )
        assert reply["status"] == "ok", reply
        assert "state COMPLETED|0:0" in out, out
        assert out.count("ran on n") == 2, out
        # the same file on the host: output paths are the same inside and out
        assert (shared_cwd / "job.out").read_text().count("ran on n") == 2
        job_id = ""
    finally:
        if job_id:  # only the job this test submitted
            run_command(["scancel", job_id], check=False)
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_kernelspec_can_opt_out_of_slurm(kernel_site, stack):
    kernel_site.install(stack.base_image, "slurm-out", slurm=False)
    km, kc, _ = start("slurm-out")
    try:
        reply, out = run(kc, "import shutil; print('srun:', shutil.which('srun'))")
        assert reply["status"] == "ok" and "srun: None" in out, out
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


BUILT = "localhost/tests/slurm-login:built"


@pytest.fixture(scope="module")
def login_node(stack):
    """podman-hpc on the host where kernels start, after `podman-hpc pull` there (the base image in
    node-local storage and squashed) and a build FROM it (local only: the build-test loop); the
    user's uid shim is built by podman-hpc itself, in the test's own cache (no variable names it)."""
    hpc = make_hpc(stack, "slurm-login")
    hpc("pull", stack.base_image)
    assert "local + squashed" in hpc("images").stdout
    context = hpc.work / "ctx"
    context.mkdir(parents=True, exist_ok=True)
    (context / "Containerfile").write_text(f"FROM {stack.base_image}\nRUN echo built > /built\n")
    hpc("build", "-t", BUILT, context)
    hpc.env["XDG_CACHE_HOME"] = str(hpc.work / "cache")
    assert slurm.SHIM_VARIABLE not in hpc.env
    yield hpc
    cleanup_hpc(hpc)


CELL = textwrap.dedent("""\
    import os, subprocess
    print("uid", os.getuid(), "map", open("/proc/self/uid_map").read().split())
    step = subprocess.run(["srun", "-N2", "hostname"], capture_output=True, text=True, timeout=120)
    print("srun", step.returncode, step.stdout.split(), step.stderr.strip())
    mine = subprocess.run(["squeue", "--me", "-h", "-o", "%i"], capture_output=True, text=True)
    print("squeue", mine.returncode, mine.stderr.strip())
    """)


@pytest.mark.parametrize("image, keep_id", [("pulled", False), ("built", True)])
def test_srun_from_a_kernel_of_an_image_pulled_or_built_on_the_same_host(
    login_node, stack, shared_cwd, tmp_path, monkeypatch, image, keep_id
):
    """The pulled image (local and squashed) runs from its squashed copy, as the container's root
    (keep_id "auto" leaves keep-id out there); the built one from its local layers with
    --userns=keep-id, a namespace nested in podman's. Slurm works in both."""
    env = site_env(login_node, tmp_path)
    use_env(monkeypatch, env)
    site = KernelSite(login_node, tmp_path, env)
    site.install(stack.base_image if image == "pulled" else BUILT, "slurm-login")
    km, kc, _ = start("slurm-login", cwd=str(shared_cwd))
    try:
        reply, out = run(kc, CELL, timeout=150)
        assert reply["status"] == "ok", reply
        uid = os.getuid()
        if keep_id:  # the user's uid inside, mapped to 0 of podman's namespace (not to the host's uid)
            assert f"uid {uid} " in out and f"'{uid}', '0', '1'" in out, out
        else:  # the container's root is the user
            assert f"uid 0 map ['0', '{uid}', '1'" in out, out
        host = socket.gethostname()
        assert f"srun 0 ['{host}', '{host}'] " in out, out  # the stack's nodes all run on this host
        assert "squeue 0 \n" in out, out
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        remove_kernel_containers(login_node)


NESTED = "unshare --user --map-root-user"
LAYOUTS = {  # options, command prefix, the innermost namespace's first uid_map line
    # podman's rootless namespace alone: the container's root is the user
    "root-is-the-user": ([], "", ["0", "{uid}", "1"]),
    "keep-id": (["--userns=keep-id"], "", ["0", "1", "{uid}"]),
    "auto-mapping-the-user": (["--userns=auto:uidmapping=0:0:1,gidmapping=0:0:1"], "", ["0", "0", "1"]),
    "nested-below-root": ([], NESTED, ["0", "0", "1"]),
    "nested-below-keep-id": (["--userns=keep-id"], NESTED, ["0", "{uid}", "1"]),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_uid_shim_gives_the_host_ids_in_every_layout(login_node, layout):
    """Through `podman-hpc run --slurm` of the image built on this host (local layers: keep-id and
    automatic namespaces cannot run from a squash file here), a job step as the user."""
    options, prefix, first_map = LAYOUTS[layout]
    script = (
        "cat /proc/self/uid_map; srun -N1 sh -c 'echo ids=$(id -u):$(id -g)' && "
        '[ -z "$(squeue --me -h -o %i 2>&1 >/dev/null)" ] && echo squeue-me-ok'
    )  # it errs with status 0
    result = login_node(
        "run", "--rm", "--slurm", *options, BUILT, *shlex.split(prefix), "sh", "-c", script, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"ids={os.getuid()}:{os.getgid()}" in result.stdout.split(), result.stdout + result.stderr
    # the layout is the one named: what the innermost namespace sees of its parent
    assert result.stdout.split()[:3] == [v.format(uid=os.getuid()) for v in first_map], result.stdout
    # squeue --me too ("Invalid user: 1001" where the image has no entry for the user, without the shim's)
    assert "squeue-me-ok" in result.stdout.split(), result.stdout + result.stderr
    # the shim podman-hpc built for --slurm, in the user's cache
    assert list((login_node.work / "cache" / "podman-hpc").glob("slurm-uid-*.so"))


def test_an_automatic_namespace_without_the_user_is_refused_with_a_hint(login_node):
    """No uid of such a container is the user's on the host: munge vouches for a subordinate uid, so
    slurmctld refuses whatever the request says (the shim cannot, and must not, get it through)."""
    result = login_node(
        "run",
        "--rm",
        "--slurm",
        "--userns=auto",
        BUILT,
        "sh",
        "-c",
        "cat /proc/self/uid_map; srun -N1 true",
        check=False,
    )
    assert result.returncode != 0, result.stdout
    assert result.stdout.split()[:2] == ["0", "1"], result.stdout  # the user (0 of podman's) is not mapped
    assert "Invalid user id" in result.stderr, result.stderr
    assert "this container's user is not you on the host" in result.stderr, result.stderr
