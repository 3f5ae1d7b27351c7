"""The rank path: a task that is not its node's first checks the monitor's plan before it runs it."""

import os
import shutil
import socket
import subprocess
import sys
import threading
import uuid

import pytest

from jupyter_podman_hpc import rank, stepsocket
from jupyter_podman_hpc.engine.site.config import load_config


def _plan(key="7.1.n2", **changes):
    name = stepsocket.container_name(os.getuid(), key)
    plan = {
        "join": False,
        "command": ["true"],
        "env": None,
        "workdir": None,
        "argv": ["/usr/bin/podman", "--root", "/r", "exec", "-e", "A", name, "true"],
        "podman_env": {"set": {"XDG_CONFIG_HOME": "/c"}, "unset": ["XDG_RUNTIME_DIR"]},
    }
    plan.update(changes)
    return plan


def test_a_plan_of_another_shape_than_the_monitors_is_refused():
    assert rank.checked_plan(_plan(), "7.1.n2", {}) == _plan()
    name = stepsocket.container_name(os.getuid(), "7.1.n2")
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


def test_a_plan_may_run_in_the_container_the_jobs_steps_share_on_this_node_and_no_other():
    environ = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1", "SLURMD_NODENAME": "n2"}
    shared = stepsocket.container_name(os.getuid(), stepsocket.reuse_key("7", "n2", "0123456789ab"))
    plan = _plan(argv=["/usr/bin/podman", "exec", shared, "true"])
    assert rank.checked_plan(plan, "7.1.n2", environ) == plan
    for other_job, node, digest in (
        ("8", "n2", "0123456789ab"),
        ("7", "n3", "0123456789ab"),
        ("7", "n2", "0123456789"),
        ("7", "n2", "0123456789aX"),
    ):
        name = stepsocket.container_name(os.getuid(), stepsocket.reuse_key(other_job, node, digest))
        with pytest.raises(rank.Refused):
            rank.checked_plan(_plan(argv=["/usr/bin/podman", "exec", name, "true"]), "7.1.n2", environ)
    with pytest.raises(rank.Refused):  # not in a Slurm step: no job to share with
        rank.checked_plan(plan, "7.1.n2", {})


def test_the_variables_a_plan_may_set_are_those_podman_hpc_gives_podman(monkeypatch, tmp_path):
    """rank.py keeps its own list (importing the read path's settings would slow every task): it must
    name exactly what SiteConfig.podman_env sets, or a --no-join task refuses its monitor's plan."""
    monkeypatch.setenv("PODMANHPC_CONFIG_FILE", str(tmp_path / "none.yaml"))
    (tmp_path / "none.yaml").write_text("{}\n")
    monkeypatch.setenv("SLURM_JOB_ID", "7")  # a job: every read-path variable is set
    before = {"XDG_RUNTIME_DIR": "/run/user/1", "KEPT": "x"}
    after = load_config().podman_env(before)
    assert {key for key, value in after.items() if before.get(key) != value} == rank.PODMAN_ENV_SET
    assert set(before) - set(after) == rank.PODMAN_ENV_UNSET


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
    config.write_text(f'# site\nrun_root: /x\npodman_bin: "{other}"  # ours\n')
    with pytest.raises(rank.Refused):
        rank.check_podman(str(podman), {**env, "PODMANHPC_CONFIG_FILE": str(config)})
    rank.check_podman(str(other), {**env, "PODMANHPC_CONFIG_FILE": str(config)})
    rank.check_podman(str(podman), {**env, "PODMANHPC_CONFIG_FILE": str(config), "PODMANHPC_PODMAN_BIN": "podman"})
    # the engine reads the same value from the same file
    assert load_config({"PODMANHPC_CONFIG_FILE": str(config)}).podman_bin == str(other)


def _serve_one_plan(address, plan, fds=()):
    """A fake monitor of this user (so the peer checks pass): answers one task with ``plan``."""
    kind, listener = stepsocket.rendezvous(address)
    assert kind == "listener"

    def serve():
        server = socket.socket(fileno=listener._accept()[0])
        stepsocket.receive(server)
        stepsocket.send(server, {"plan": plan}, fds)
        server.recv(1)  # until the task ends
        server.close()
        listener.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def _task(env):
    return subprocess.run(
        [sys.executable, "-m", "jupyter_podman_hpc.rank", "shared-run", "img", "true"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("how", ["another program", "podman with LD_PRELOAD", "a host process to join"])
def test_a_task_refuses_a_malicious_plan_in_one_line_and_runs_nothing(tmp_path, how):
    job = f"unit{uuid.uuid4().hex[:8]}"
    env = {"SLURM_JOB_ID": job, "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "n1"}
    key = stepsocket.step_key(job, "0", "n1")
    marker = tmp_path / "marker"
    name = stepsocket.container_name(os.getuid(), key)
    fds = ()
    if how == "another program":
        plan = _plan(key, command=["true"], argv=["/bin/sh", "-c", f"touch {marker}", "exec", name, "true"])
    elif how == "podman with LD_PRELOAD":
        plan = _plan(
            key,
            argv=[shutil.which("true"), "exec", name, "true"],
            podman_env={"set": {"LD_PRELOAD": str(marker)}, "unset": []},
        )
    else:  # join "the container" whose first process is this test: the command would run on the host
        plan = _plan(
            key, join=True, command=["touch", str(marker)], argv=["/usr/bin/podman", "exec", name, "touch", str(marker)]
        )
        fds = (os.pidfd_open(os.getpid()),)
    thread = _serve_one_plan(stepsocket.address_of(key), plan, fds)
    result = _task(env)
    thread.join(10)
    assert result.returncode == 125, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert ("no container" if how == "a host process to join" else "nothing was run") in result.stderr
    assert not marker.exists()


def test_a_task_runs_the_configured_podman_of_a_good_plan(tmp_path):
    """The shape the checks allow is what runs: a stand-in podman (first on PATH) gets the argv."""
    job = f"unit{uuid.uuid4().hex[:8]}"
    key = stepsocket.step_key(job, "0", "n1")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    podman = bin_dir / "podman"
    out = tmp_path / "out"
    podman.write_text(f'#!/bin/sh\necho "$XDG_CONFIG_HOME ${{XDG_RUNTIME_DIR-unset}} $*" > {out}\n')
    podman.chmod(0o755)
    name = stepsocket.container_name(os.getuid(), key)
    plan = _plan(key, argv=[str(podman), "exec", name, "true"])
    thread = _serve_one_plan(stepsocket.address_of(key), plan)
    result = _task(
        {
            "SLURM_JOB_ID": job,
            "SLURM_STEP_ID": "0",
            "SLURMD_NODENAME": "n1",
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "XDG_RUNTIME_DIR": "/run/x",
            "PODMANHPC_CONFIG_FILE": str(tmp_path / "none.yaml"),
        }
    )
    thread.join(10)
    assert result.returncode == 0, result.stderr
    assert out.read_text() == f"/c unset exec {name} true\n"


NEVER_LOADED = (
    "re",
    "enum",
    "json",
    "socket",
    "subprocess",
    "logging",
    "signal",
    "hashlib",
    "jupyter_podman_hpc.cli",
    "jupyter_podman_hpc.engine.site.config",
    "jupyter_podman_hpc.engine.run.launcher",
)


@pytest.mark.parametrize("how", ["podman exec", "join"])
def test_a_task_that_is_not_the_first_imports_almost_nothing(tmp_path, how):
    """The console script's path for a task that is not its node's first, in a bare interpreter
    (``-I -S``: nothing of site's): it talks to the monitor and runs its plan without ``re``,
    ``enum``, ``json``, ``socket`` or the CLI."""
    job = f"unit{uuid.uuid4().hex[:8]}"
    key = stepsocket.step_key(job, "0", "n1")
    name = stepsocket.container_name(os.getuid(), key)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    podman = bin_dir / "podman"
    podman.write_text("#!/bin/sh\nexit 0\n")
    podman.chmod(0o755)
    fds = ()
    plan = _plan(key, argv=[str(podman), "exec", name, "true"])
    if how == "join":  # a process that is no container: the join is refused, after join's imports
        plan["join"] = True
        fds = (os.pidfd_open(os.getpid()),)
    thread = _serve_one_plan(stepsocket.address_of(key), plan, fds)
    root = os.path.dirname(os.path.dirname(rank.__file__))
    script = (
        f"import sys; sys.path.insert(0, {root!r}); sys.argv = ['podman-hpc', 'shared-run', 'img', 'true']\n"
        "from jupyter_podman_hpc import rank\n"
        "code = rank.main()\n"
        "sys.stdout.write(' '.join(sorted(sys.modules)))\n"
        "sys.exit(code)\n"
    )
    env = {
        **os.environ,
        "SLURM_JOB_ID": job,
        "SLURM_STEP_ID": "0",
        "SLURMD_NODENAME": "n1",
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PODMANHPC_CONFIG_FILE": str(tmp_path / "none.yaml"),
    }
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    thread.join(10)
    for fd in fds:
        os.close(fd)
    assert result.returncode == (125 if how == "join" else 0), result.stderr
    loaded = set(result.stdout.split())
    assert "jupyter_podman_hpc.stepsocket" in loaded
    assert (
        ("jupyter_podman_hpc.engine.run.join" in loaded) == ("jupyter_podman_hpc.engine" in loaded) == (how == "join")
    )
    assert [module for module in NEVER_LOADED if module in loaded] == []
    if how == "podman exec":  # rank and stepsocket alone: not even __future__
        assert "__future__" not in loaded
