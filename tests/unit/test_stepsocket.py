"""The step socket: the rendezvous (keyed names, peer checks), the user's key, message framing,
and every task's one exec, wait and signal path: exit codes as a shell gives them, 128 + N
for signal N, whether the command or podman itself dies."""

import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from jupyter_podman_hpc import stepsocket
from jupyter_podman_hpc.engine.run.stepcontext import step_context
from jupyter_podman_hpc.engine.site.config import load_config

NAMED = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1", "SLURMD_NODENAME": "n2"}


def test_first_binds_the_others_connect_and_messages_round_trip():
    address = stepsocket.address_of(f"unit-{uuid.uuid4().hex}.0.node")
    kind, listener = stepsocket.rendezvous(address)
    assert kind == "listener"
    other, connection = stepsocket.rendezvous(address)
    assert other == "connection" and stepsocket.peer_problem(connection) is None
    assert connection.fileno() >= 10 and listener.fileno() >= 10  # never fd 3, where PMI_FD goes
    server = socket.socket(fileno=listener._accept()[0])
    assert stepsocket.peer_problem(server) is None
    message = {"kind": "plan", "argv": ["shared-run", "img"], "env": {"A": "1" * 100000}}
    stepsocket.send(connection, message)
    assert stepsocket.receive(server) == message
    pidfd = os.pidfd_open(os.getpid())
    stepsocket.send(server, {"ready": {"pid": 1}}, [pidfd])  # a pidfd travels with its message
    fds = []
    assert stepsocket.receive(connection, fds) == {"ready": {"pid": 1}} and len(fds) == 1
    assert os.get_inheritable(fds[0]) is False  # never passed on to the command
    os.close(fds[0])
    os.close(pidfd)
    server.close()
    assert stepsocket.receive(connection) is None  # the monitor went away
    listener.close()
    again, fresh = stepsocket.rendezvous(address)  # an abstract name goes with its last holder
    assert again == "listener"
    fresh.close()


def test_outside_a_step_there_is_no_rendezvous():
    assert stepsocket.step_address({}) is None
    assert stepsocket.step_address(NAMED) == stepsocket.address_of("7.1.n2")


def test_the_step_key_has_one_definition():
    """The console script's rendezvous, the CLI's and the container name come from one key."""
    config = load_config({})
    for env in (
        NAMED,
        {"SLURM_JOBID": "8", "SLURM_STEPID": "0", "SLURMD_NODENAME": "n/1 x"},
        {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "4294967290"},
    ):
        context = step_context(config, env)
        assert stepsocket.environ_step_key(env) == context.key
        assert stepsocket.step_address(env) == stepsocket.address_of(context.key)
        assert context.container_name(1001) == stepsocket.container_name(1001, context.key)
    assert stepsocket.container_name(5, "1.0.n/1 x") == "podman-hpc-5-1.0.n_1_x"


def test_names_are_keyed_so_nobody_can_compute_them_without_the_users_secret(monkeypatch):
    address = stepsocket.address_of("7.1.n2")
    assert address.startswith(f"\0podman-hpc/{os.getuid()}/") and len(address) < 108
    assert "7.1.n2" not in address  # the old, predictable scheme: \0podman-hpc/<uid>/<job>.<step>.<node>
    assert address == stepsocket.address_of("7.1.n2") != stepsocket.address_of("7.2.n2")
    monkeypatch.setattr(stepsocket, "_secret", os.urandom(stepsocket.KEY_SIZE))
    assert stepsocket.address_of("7.1.n2") != address  # another user's (or a guessed) key: another name


def _key_in(directory):
    return os.path.join(directory, "podman-hpc", "rendezvous", "key")


def test_the_key_is_made_once_private_and_shared_by_simultaneous_first_tasks(tmp_path):
    path = _key_in(tmp_path)
    script = (
        "from jupyter_podman_hpc import stepsocket; import sys; "
        f"sys.stdout.write(stepsocket.load_secret({path!r}).hex())"
    )
    children = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(8)]
    keys = {child.communicate()[0] for child in children}
    assert len(keys) == 1 and len(bytes.fromhex(keys.pop())) == stepsocket.KEY_SIZE
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
    assert sorted(os.listdir(os.path.dirname(path))) == ["key"]  # no partial files left
    assert stepsocket.key_path({"XDG_CACHE_HOME": str(tmp_path)}) == path
    assert stepsocket.key_path({"HOME": "/h"}) == "/h/.cache/podman-hpc/rendezvous/key"


def test_a_key_or_directory_others_could_touch_is_refused(tmp_path):
    path = _key_in(tmp_path)
    key = stepsocket.load_secret(path)
    directory = os.path.dirname(path)
    os.chmod(directory, 0o755)  # the user's own, nobody else could write: tightened
    assert stepsocket.load_secret(path) == key and os.stat(directory).st_mode & 0o777 == 0o700
    os.chmod(path, 0o644)
    with pytest.raises(stepsocket.Refused, match="not a private file"):
        stepsocket.load_secret(path)
    os.chmod(path, 0o600)
    os.chmod(directory, 0o777)
    with pytest.raises(stepsocket.Refused, match="lets others write"):
        stepsocket.load_secret(path)
    os.chmod(directory, 0o700)
    with open(path, "ab") as file:
        file.write(b"x")
    with pytest.raises(stepsocket.Refused, match="33 bytes"):
        stepsocket.load_secret(path)
    moved = tmp_path / "elsewhere"
    os.rename(directory, moved)
    os.symlink(moved, directory)
    with pytest.raises(stepsocket.Refused, match="not a directory"):
        stepsocket.load_secret(path)
    os.unlink(directory)
    target = tmp_path / "target"
    target.write_bytes(key)
    os.makedirs(directory, 0o700)
    os.symlink(target, path)
    with pytest.raises(OSError):  # O_NOFOLLOW: never a key through a link
        stepsocket.load_secret(path)


def _in_another_userns(script: str) -> subprocess.Popen:
    """``script`` in a new user namespace (as a rootless container is), same uid outside."""
    child = subprocess.Popen(
        ["unshare", "--user", "--map-root-user", sys.executable, "-c", script], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "ready"
    return child


def test_a_rendezvous_held_from_another_user_namespace_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(stepsocket, "CONNECT_TIMEOUT", 1)
    address = stepsocket.address_of(f"unit-{uuid.uuid4().hex}.0.node")
    squatter = _in_another_userns(
        "import socket, time\n"
        f"s = socket.socket(socket.AF_UNIX); s.bind({address!r}); s.listen(0)\n"
        "print('ready', flush=True); time.sleep(30)\n"
    )
    try:
        with pytest.raises(stepsocket.Refused) as refused:
            stepsocket.rendezvous(address)
        assert "another user namespace" in str(refused.value) and "\n" not in str(refused.value)
        # the squatter listens with no room and never accepts: the next task must not hang either
        with pytest.raises(stepsocket.Refused):
            stepsocket.rendezvous(address)
    finally:
        squatter.kill()
        squatter.wait()


def test_the_monitor_side_refuses_a_task_from_another_user_namespace():
    address = stepsocket.address_of(f"unit-{uuid.uuid4().hex}.0.node")
    kind, listener = stepsocket.rendezvous(address)
    assert kind == "listener"
    intruder = _in_another_userns(
        "import socket, time\n"
        f"s = socket.socket(socket.AF_UNIX); s.connect({address!r})\n"
        "print('ready', flush=True); time.sleep(30)\n"
    )
    try:
        server = socket.socket(fileno=listener._accept()[0])
        assert "another user namespace" in stepsocket.peer_problem(server)
        server.close()
    finally:
        intruder.kill()
        intruder.wait()
        listener.close()


# --- running the plan ---------------------------------------------------------------


def _exec_plan(podman: str, *args: str) -> dict:
    return {
        "join": False,
        "command": ["true"],
        "env": None,
        "workdir": None,
        "argv": [podman, "exec", *args],
        "podman_env": {"set": {"XDG_CONFIG_HOME": "/c"}, "unset": ["XDG_RUNTIME_DIR"]},
    }


def _stand_in(tmp_path, body: str) -> str:
    """A stand-in podman: a shell script."""
    podman = tmp_path / "podman"
    podman.write_text(f"#!/bin/sh\n{body}\n")
    podman.chmod(0o755)
    return str(podman)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT])
def test_podman_killed_by_a_signal_is_128_plus_n(tmp_path, signum):
    podman = _stand_in(tmp_path, f"kill -{signum.name[3:]} $$; sleep 5")
    assert stepsocket.run_plan(_exec_plan(podman), None, {"PATH": "/usr/bin:/bin"}) == 128 + signum


def test_an_exit_code_is_passed_through_and_podmans_environment_applied(tmp_path):
    out = tmp_path / "out"
    podman = _stand_in(tmp_path, f'echo "$XDG_CONFIG_HOME ${{XDG_RUNTIME_DIR-unset}} $*" > {out}; exit 3')
    assert (
        stepsocket.run_plan(_exec_plan(podman, "c", "true"), None, {"XDG_RUNTIME_DIR": "/run/x", "PATH": "/bin"}) == 3
    )
    assert out.read_text() == "/c unset exec c true\n"


def test_a_missing_podman_is_127(tmp_path):
    assert stepsocket.run_plan(_exec_plan(str(tmp_path / "none")), None, {}) == 127


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP])
def test_the_signals_a_task_gets_reach_its_command_and_its_code_says_which(tmp_path, signum):
    """srun and scancel signal the task (the podman-hpc process): it passes them on and
    reports the command's death by signal N as 128 + N."""
    started = tmp_path / "started"
    podman = _stand_in(tmp_path, f"touch {started}; exec sleep 30")
    script = (
        f"import sys; from jupyter_podman_hpc import stepsocket; "
        f"sys.exit(stepsocket.run_plan({_exec_plan(podman)!r}, None, {{}}))"
    )
    task = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # sh exec'd sleep
    task.send_signal(signum)
    assert task.wait(30) == 128 + signum


def test_pmi_fd_reaches_podman_as_fd_3(tmp_path):
    out = tmp_path / "out"
    podman = _stand_in(tmp_path, f'echo "$PMI_FD $(cat <&3)" > {out}')
    read_end, write_end = os.pipe()
    os.write(write_end, b"pmi")
    os.close(write_end)
    script = (
        f"import os, sys; from jupyter_podman_hpc import stepsocket; "
        f"sys.exit(stepsocket.run_plan({_exec_plan(podman)!r}, None, dict(os.environ)))"
    )
    subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PMI_FD": str(read_end)},
        pass_fds=(read_end,),
        check=True,
        timeout=30,
    )
    os.close(read_end)
    assert out.read_text() == "3 pmi\n"
    assert stepsocket.pmi_fd_args({"PMI_FD": "7"}) == ["--preserve-fds", "1"] and stepsocket.pmi_fd_args({}) == []


def test_a_subprocess_code_reads_as_a_shells():
    assert [stepsocket.shell_code(code) for code in (0, 3, -15, -9)] == [0, 3, 143, 137]


def test_a_plan_that_joins_runs_through_join_and_falls_back_to_podman_exec(tmp_path):
    """The caller's join (engine.run.join.run_joined) runs the command, or says podman exec must (None)."""
    podman = _stand_in(tmp_path, "exit 4")
    plan = {**_exec_plan(podman), "join": True, "env": {"A": "1"}, "workdir": "/w"}
    calls = []
    assert stepsocket.run_plan(plan, 9, {}, join=lambda *args: calls.append(args) or 5) == 5
    assert calls == [(9, ["true"], {"A": "1"}, "/w")]
    assert stepsocket.run_plan(plan, 9, {}, join=lambda *args: None) == 4
    assert stepsocket.run_plan({**plan, "join": False}, 9, {}, join=lambda *args: 5) == 4
