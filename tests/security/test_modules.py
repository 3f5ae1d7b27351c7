"""Site modules against a hostile image: no module's container can reach the engine's state.

The attacker is the image's author; the victim (hpcuser) runs the image with a shipped module.
podman-hpc 1.2.2's modules bind all of ``/tmp`` (``jupyter``: the run root and hooks live in
``/tmp/<uid>_hpc``) or of ``/dev/shm`` (the MPI modules: the unpacked images live in
``/dev/shm/<uid>_hpc``), and the MPI ones add ``--privileged`` to ``--pid=host``, which opens
``/proc/<pid>/root`` of the user's podman processes, that is every file of the user's. Its
``slurm`` module would let an image replace the uid shim every later kernel preloads. Each test
shows the engine's state out of sight and out of reach from inside, and the module's normal
use still working.
"""

import hashlib
import os
import subprocess
import textwrap

import pytest

from jupyter_podman_hpc.engine.site.modules import PRIVATE_SHM

# Run inside the container: every way in we know of, each printing what it reached.
PROBE = textwrap.dedent("""\
    for path in "$RUN_ROOT" "$UNPACK"; do
        [ -e "$path" ] && echo "visible: $path"
        touch "$path/planted" 2>/dev/null && echo "writable: $path"
        for proc in /proc/[0-9]*; do
            [ -e "$proc/root$path" ] && echo "through $proc/root: $path"
        done
    done
    echo probed
    """)


def engine_state(victim) -> dict[str, str]:
    """The victim's run root and unpack cache, as the container would see them on the host."""
    return {"RUN_ROOT": victim.env["PODMANHPC_RUN_ROOT"], "UNPACK": victim.env["PODMANHPC_SQUASH_UNPACK_DIR"]}


def probe(victim, module: str, image: str) -> list[str]:
    state = engine_state(victim)
    for path in state.values():
        assert os.path.isdir(path), f"the probe needs {path} to exist on the host"
    result = victim(
        "run",
        "--rm",
        f"--{module}",
        "-e",
        f"RUN_ROOT={state['RUN_ROOT']}",
        "-e",
        f"UNPACK={state['UNPACK']}",
        image,
        "sh",
        "-c",
        PROBE,
    )
    lines = result.stdout.splitlines()
    assert lines[-1:] == ["probed"], result.stdout + result.stderr
    for path in state.values():
        assert not os.path.exists(os.path.join(path, "planted"))
    return lines[:-1]


@pytest.fixture
def prepared(victim):
    """The victim's state directories made (podman-hpc makes them on its first command), and
    a private shared-memory directory of the test's own below its unpack cache's parent."""
    victim("images")
    victim.env[PRIVATE_SHM] = os.path.join(os.path.dirname(victim.env["PODMANHPC_SQUASH_UNPACK_DIR"]), "ipc")
    return victim


def test_jupyter_module_binds_home_and_runtime_dir_not_tmp(prepared, stack):
    victim = prepared
    assert probe(victim, "jupyter", stack.tiny_image) == []
    # the normal use: $HOME (notebooks, ~/.local/share/jupyter/runtime) and $JUPYTER_RUNTIME_DIR
    runtime = victim.work / "runtime"
    runtime.mkdir()
    victim.env["JUPYTER_RUNTIME_DIR"] = str(runtime)
    home_file = os.path.join(victim.env["HOME"], f".jph-test-{os.path.basename(victim.work)}")
    try:
        victim(
            "run",
            "--rm",
            "--jupyter",
            stack.tiny_image,
            "sh",
            "-c",
            f"echo kernel > {runtime}/kernel-1.json && echo nb > {home_file}",
        )
        assert (runtime / "kernel-1.json").read_text() == "kernel\n"
        assert open(home_file).read() == "nb\n"
    finally:
        if os.path.exists(home_file):
            os.unlink(home_file)


@pytest.mark.parametrize("module", ["mpich", "openmpi-pmi2", "openmpi-pmix"])
def test_mpi_modules_share_private_memory_not_the_engine_state(prepared, stack, module):
    victim = prepared
    flag = {"mpich": "mpi"}.get(module, module)
    assert probe(victim, flag, stack.tiny_image) == []
    # the normal use: ranks in separate containers share /dev/shm (the user's own directory)...
    victim("run", "--rm", f"--{flag}", stack.tiny_image, "sh", "-c", "echo segment > /dev/shm/jph-seg")
    shared = victim("run", "--rm", f"--{flag}", stack.tiny_image, "cat", "/dev/shm/jph-seg")
    assert shared.stdout == "segment\n"
    private = victim.env[PRIVATE_SHM]
    assert open(os.path.join(private, "jph-seg")).read() == "segment\n"
    assert oct(os.stat(private).st_mode & 0o777) == "0o700"
    # ... and read each other's memory (cross-memory attach, as MPI's shared-memory transports do)
    cma = victim.work / "cma.py"
    cma.write_text(CROSS_MEMORY)
    cma.chmod(0o644)
    holder = victim.command(
        [
            "podman-hpc",
            "run",
            "--rm",
            f"--{flag}",
            "-v",
            f"{cma}:/cma.py:ro",
            stack.base_image,
            "python3",
            "/cma.py",
            "hold",
        ]
    )
    process = subprocess.Popen(holder[0], env=holder[1], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "holding"
        reader = victim(
            "run", "--rm", f"--{flag}", "-v", f"{cma}:/cma.py:ro", stack.base_image, "python3", "/cma.py", "read"
        )
        assert reader.stdout.strip() == "read b'from-rank-0'", reader.stdout + reader.stderr
    finally:
        process.wait(timeout=60)


CROSS_MEMORY = textwrap.dedent("""\
    import ctypes, os, sys, time
    libc = ctypes.CDLL(None, use_errno=True)
    class iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
    if sys.argv[1] == "hold":
        buffer = ctypes.create_string_buffer(b"from-rank-0", 16)
        with open("/dev/shm/jph-cma", "w") as out:
            out.write(f"{os.getpid()} {ctypes.addressof(buffer)}")
        print("holding", flush=True)
        for _ in range(600):
            if not os.path.exists("/dev/shm/jph-cma"):
                break
            time.sleep(0.05)
    else:
        pid, address = map(int, open("/dev/shm/jph-cma").read().split())
        out = ctypes.create_string_buffer(16)
        local, remote = iovec(ctypes.addressof(out), 11), iovec(address, 11)
        got = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        os.unlink("/dev/shm/jph-cma")
        print("read", out.value if got == 11 else os.strerror(ctypes.get_errno()))
    """)


def test_slurm_module_mounts_the_uid_shim_read_only(prepared, stack):
    victim = prepared
    victim.env["XDG_CACHE_HOME"] = str(victim.work / "cache")  # not the user's own shim: the test may fail
    shim = victim.sh(
        "python",
        "-c",
        "import os; from jupyter_podman_hpc.engine.site.hostslurm import uid_shim; print(uid_shim(os.environ))",
    ).stdout.strip()
    assert os.path.isfile(shim), shim
    before = hashlib.sha256(open(shim, "rb").read()).hexdigest()
    victim.env["PODMANHPC_SLURM_UID_SHIM"] = shim
    attack = victim(
        "run",
        "--rm",
        "--slurm",
        stack.tiny_image,
        "sh",
        "-c",
        "cp /bin/sh /opt/podman-hpc/slurm/uid.so 2>&1; echo replaced=$?",
        check=False,
    )
    assert "Read-only file system" in attack.stdout and "replaced=1" in attack.stdout, attack.stdout
    assert hashlib.sha256(open(shim, "rb").read()).hexdigest() == before
    assert oct(os.stat(shim).st_mode & 0o777) == "0o500"
    assert oct(os.stat(os.path.dirname(shim)).st_mode & 0o777) == "0o700"
    assert probe(victim, "slurm", stack.tiny_image) == []
    # the normal use: Slurm's commands talk to the cluster (munge's socket, read-only, still answers)
    partitions = victim("run", "--rm", "--slurm", stack.base_image, "sinfo", "-h", "-o", "%P")
    assert stack.partition in partitions.stdout, partitions.stdout + partitions.stderr
