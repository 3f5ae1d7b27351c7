"""The rank path: the rendezvous (keyed names, peer checks), the user's key, and the plan checks."""

import os
import shutil
import socket
import subprocess
import sys
import threading
import uuid

import pytest

from jupyter_podman_hpc import rank
from jupyter_podman_hpc.engine.config import load_config
from jupyter_podman_hpc.engine.launcher import step_context

NAMED = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1", "SLURMD_NODENAME": "n2"}


def test_first_binds_the_others_connect_and_messages_round_trip():
    address = rank.address_of(f"unit-{uuid.uuid4().hex}.0.node")
    kind, listener = rank.rendezvous(address)
    assert kind == "listener"
    other, connection = rank.rendezvous(address)
    assert other == "connection" and rank.peer_problem(connection) is None
    assert connection.fileno() >= 10 and listener.fileno() >= 10  # never fd 3, where PMI_FD goes
    server = socket.socket(fileno=listener._accept()[0])
    assert rank.peer_problem(server) is None
    message = {"kind": "plan", "argv": ["shared-run", "img"], "env": {"A": "1" * 100000}}
    rank.send(connection, message)
    assert rank.receive(server) == message
    pidfd = os.pidfd_open(os.getpid())
    rank.send(server, {"ready": {"pid": 1}}, [pidfd])  # a pidfd travels with its message
    fds = []
    assert rank.receive(connection, fds) == {"ready": {"pid": 1}} and len(fds) == 1
    assert os.get_inheritable(fds[0]) is False  # never passed on to the command
    os.close(fds[0])
    os.close(pidfd)
    server.close()
    assert rank.receive(connection) is None  # the monitor went away
    listener.close()
    again, fresh = rank.rendezvous(address)  # an abstract name goes with its last holder
    assert again == "listener"
    fresh.close()


def test_outside_a_step_there_is_no_rendezvous():
    assert rank.step_address({}) is None
    assert rank.step_address(NAMED) == rank.address_of("7.1.n2")


def test_the_step_key_has_one_definition():
    """The console script's rendezvous, the CLI's and the container name come from one key."""
    config = load_config({})
    for env in (NAMED, {"SLURM_JOBID": "8", "SLURM_STEPID": "0", "SLURMD_NODENAME": "n/1 x"},
                {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "4294967290"}):
        context = step_context(config, env)
        assert rank.environ_step_key(env) == context.key
        assert rank.step_address(env) == rank.address_of(context.key)
        assert context.container_name(1001) == rank.container_name(1001, context.key)
    assert rank.container_name(5, "1.0.n/1 x") == "podman-hpc-5-1.0.n_1_x"


def test_names_are_keyed_so_nobody_can_compute_them_without_the_users_secret(monkeypatch):
    address = rank.address_of("7.1.n2")
    assert address.startswith(f"\0podman-hpc/{os.getuid()}/") and len(address) < 108
    assert "7.1.n2" not in address  # the old, predictable scheme: \0podman-hpc/<uid>/<job>.<step>.<node>
    assert address == rank.address_of("7.1.n2") != rank.address_of("7.2.n2")
    monkeypatch.setattr(rank, "_secret", os.urandom(rank.KEY_SIZE))
    assert rank.address_of("7.1.n2") != address  # another user's (or a guessed) key: another name


def _key_in(directory):
    return os.path.join(directory, "podman-hpc", "rendezvous", "key")


def test_the_key_is_made_once_private_and_shared_by_simultaneous_first_tasks(tmp_path):
    path = _key_in(tmp_path)
    script = f"from jupyter_podman_hpc import rank; import sys; sys.stdout.write(rank.load_secret({path!r}).hex())"
    children = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
                for _ in range(8)]
    keys = {child.communicate()[0] for child in children}
    assert len(keys) == 1 and len(bytes.fromhex(keys.pop())) == rank.KEY_SIZE
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
    assert sorted(os.listdir(os.path.dirname(path))) == ["key"]  # no partial files left
    assert rank.key_path({"XDG_CACHE_HOME": str(tmp_path)}) == path
    assert rank.key_path({"HOME": "/h"}) == "/h/.cache/podman-hpc/rendezvous/key"


def test_a_key_or_directory_others_could_touch_is_refused(tmp_path):
    path = _key_in(tmp_path)
    key = rank.load_secret(path)
    directory = os.path.dirname(path)
    os.chmod(directory, 0o755)  # the user's own, nobody else could write: tightened
    assert rank.load_secret(path) == key and os.stat(directory).st_mode & 0o777 == 0o700
    os.chmod(path, 0o644)
    with pytest.raises(rank.Refused, match="not a private file"):
        rank.load_secret(path)
    os.chmod(path, 0o600)
    os.chmod(directory, 0o777)
    with pytest.raises(rank.Refused, match="lets others write"):
        rank.load_secret(path)
    os.chmod(directory, 0o700)
    with open(path, "ab") as file:
        file.write(b"x")
    with pytest.raises(rank.Refused, match="33 bytes"):
        rank.load_secret(path)
    moved = tmp_path / "elsewhere"
    os.rename(directory, moved)
    os.symlink(moved, directory)
    with pytest.raises(rank.Refused, match="not a directory"):
        rank.load_secret(path)
    os.unlink(directory)
    target = tmp_path / "target"
    target.write_bytes(key)
    os.makedirs(directory, 0o700)
    os.symlink(target, path)
    with pytest.raises(OSError):  # O_NOFOLLOW: never a key through a link
        rank.load_secret(path)


def _in_another_userns(script: str) -> subprocess.Popen:
    """``script`` in a new user namespace (as a rootless container is), same uid outside."""
    child = subprocess.Popen(["unshare", "--user", "--map-root-user", sys.executable, "-c", script],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    return child


def test_a_rendezvous_held_from_another_user_namespace_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(rank, "CONNECT_TIMEOUT", 1)
    address = rank.address_of(f"unit-{uuid.uuid4().hex}.0.node")
    squatter = _in_another_userns(
        "import socket, time\n"
        f"s = socket.socket(socket.AF_UNIX); s.bind({address!r}); s.listen(0)\n"
        "print('ready', flush=True); time.sleep(30)\n")
    try:
        with pytest.raises(rank.Refused) as refused:
            rank.rendezvous(address)
        assert "another user namespace" in str(refused.value) and "\n" not in str(refused.value)
        # the squatter listens with no room and never accepts: the next task must not hang either
        with pytest.raises(rank.Refused):
            rank.rendezvous(address)
    finally:
        squatter.kill()
        squatter.wait()


def test_the_monitor_side_refuses_a_task_from_another_user_namespace():
    address = rank.address_of(f"unit-{uuid.uuid4().hex}.0.node")
    kind, listener = rank.rendezvous(address)
    assert kind == "listener"
    intruder = _in_another_userns(
        "import socket, time\n"
        f"s = socket.socket(socket.AF_UNIX); s.connect({address!r})\n"
        "print('ready', flush=True); time.sleep(30)\n")
    try:
        server = socket.socket(fileno=listener._accept()[0])
        assert "another user namespace" in rank.peer_problem(server)
        server.close()
    finally:
        intruder.kill()
        intruder.wait()
        listener.close()


def _plan(key="7.1.n2", **changes):
    name = rank.container_name(os.getuid(), key)
    plan = {"join": False, "command": ["true"], "env": None, "workdir": None,
            "argv": ["/usr/bin/podman", "--root", "/r", "exec", "-e", "A", name, "true"],
            "podman_env": {"set": {"XDG_CONFIG_HOME": "/c"}, "unset": ["XDG_RUNTIME_DIR"]}}
    plan.update(changes)
    return plan


def test_a_plan_of_another_shape_than_the_monitors_is_refused():
    assert rank.checked_plan(_plan(), "7.1.n2", {}) == _plan()
    name = rank.container_name(os.getuid(), "7.1.n2")
    bad = [
        _plan(argv=["/bin/sh", "-c", "touch /tmp/x", name, "true"]),  # no exec
        _plan(argv=["/usr/bin/podman", "exec", "other-container", "true"]),
        _plan(command=["sh", "-c", "id"]),  # argv runs something else than the command
        _plan(podman_env={"set": {"LD_PRELOAD": "/tmp/evil.so"}, "unset": []}),
        _plan(podman_env={"set": {}, "unset": ["PATH"]}),
        {**_plan(), "pmi_fd": 3},
        _plan(join="yes"),
        _plan(command=[]),
        None,
    ]
    for plan in bad:
        with pytest.raises(rank.Refused):
            rank.checked_plan(plan, "7.1.n2", {})


def test_argv0_must_be_the_configured_podman(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    podman = bin_dir / "podman"
    podman.write_text("#!/bin/sh\n")
    podman.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PODMANHPC_CONFIG_FILE": str(tmp_path / "none.yaml")}
    rank.check_podman(str(podman), env)
    with pytest.raises(rank.Refused, match="not the configured podman"):
        rank.check_podman("/bin/sh", env)
    with pytest.raises(rank.Refused, match="podman not found"):
        rank.check_podman(str(podman), {**env, "PATH": "/nonexistent"})
    other = tmp_path / "site-podman"
    shutil.copy(podman, other)
    config = tmp_path / "podman_hpc.yaml"
    config.write_text(f"# site\nrun_root: /x\npodman_bin: \"{other}\"  # ours\n")
    with pytest.raises(rank.Refused):
        rank.check_podman(str(podman), {**env, "PODMANHPC_CONFIG_FILE": str(config)})
    rank.check_podman(str(other), {**env, "PODMANHPC_CONFIG_FILE": str(config)})
    rank.check_podman(str(podman), {**env, "PODMANHPC_CONFIG_FILE": str(config), "PODMANHPC_PODMAN_BIN": "podman"})
    # the engine reads the same value from the same file
    assert load_config({"PODMANHPC_CONFIG_FILE": str(config)}).podman_bin == str(other)


def _serve_one_plan(address, plan, fds=()):
    """A fake monitor of this user (so the peer checks pass): answers one task with ``plan``."""
    kind, listener = rank.rendezvous(address)
    assert kind == "listener"

    def serve():
        server = socket.socket(fileno=listener._accept()[0])
        rank.receive(server)
        rank.send(server, {"plan": plan}, fds)
        server.recv(1)  # until the task ends
        server.close()
        listener.close()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def _task(env):
    return subprocess.run([sys.executable, "-m", "jupyter_podman_hpc.rank", "shared-run", "img", "true"],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("how", ["another program", "podman with LD_PRELOAD", "a host process to join"])
def test_a_task_refuses_a_malicious_plan_in_one_line_and_runs_nothing(tmp_path, how):
    job = f"unit{uuid.uuid4().hex[:8]}"
    env = {"SLURM_JOB_ID": job, "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "n1"}
    key = rank.step_key(job, "0", "n1")
    marker = tmp_path / "marker"
    name = rank.container_name(os.getuid(), key)
    fds = ()
    if how == "another program":
        plan = _plan(key, command=["true"], argv=["/bin/sh", "-c", f"touch {marker}", "exec", name, "true"])
    elif how == "podman with LD_PRELOAD":
        plan = _plan(key, argv=[shutil.which("true"), "exec", name, "true"],
                     podman_env={"set": {"LD_PRELOAD": str(marker)}, "unset": []})
    else:  # join "the container" whose first process is this test: the command would run on the host
        plan = _plan(key, join=True, command=["touch", str(marker)],
                     argv=["/usr/bin/podman", "exec", name, "touch", str(marker)])
        fds = (os.pidfd_open(os.getpid()),)
    thread = _serve_one_plan(rank.address_of(key), plan, fds)
    result = _task(env)
    thread.join(10)
    assert result.returncode == 125, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert ("no container" if how == "a host process to join" else "nothing was run") in result.stderr
    assert not marker.exists()


def test_a_task_runs_the_configured_podman_of_a_good_plan(tmp_path):
    """The shape the checks allow is what runs: a stand-in podman (first on PATH) gets the argv."""
    job = f"unit{uuid.uuid4().hex[:8]}"
    key = rank.step_key(job, "0", "n1")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    podman = bin_dir / "podman"
    out = tmp_path / "out"
    podman.write_text(f'#!/bin/sh\necho "$XDG_CONFIG_HOME ${{XDG_RUNTIME_DIR-unset}} $*" > {out}\n')
    podman.chmod(0o755)
    name = rank.container_name(os.getuid(), key)
    plan = _plan(key, argv=[str(podman), "exec", name, "true"])
    thread = _serve_one_plan(rank.address_of(key), plan)
    result = _task({"SLURM_JOB_ID": job, "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "n1",
                    "PATH": f"{bin_dir}:{os.environ['PATH']}", "XDG_RUNTIME_DIR": "/run/x",
                    "PODMANHPC_CONFIG_FILE": str(tmp_path / "none.yaml")})
    thread.join(10)
    assert result.returncode == 0, result.stderr
    assert out.read_text() == f"/c unset exec {name} true\n"
