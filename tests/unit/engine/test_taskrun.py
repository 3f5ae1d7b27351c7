"""Every task's one exec, wait and signal path (engine.taskrun, stepsocket.exec_and_wait): exit
codes as a shell gives them, 128 + N for signal N, whether the command or podman itself dies."""

import os
import signal
import subprocess
import sys
import time

import pytest

from jupyter_podman_hpc import stepsocket
from jupyter_podman_hpc.engine import taskrun


def _plan(podman: str, *args: str) -> dict:
    return {"join": False, "command": ["true"], "env": None, "workdir": None,
            "argv": [podman, "exec", *args], "podman_env": {"set": {"XDG_CONFIG_HOME": "/c"},
                                                            "unset": ["XDG_RUNTIME_DIR"]}}


def _stand_in(tmp_path, body: str) -> str:
    """A stand-in podman: a shell script."""
    podman = tmp_path / "podman"
    podman.write_text(f"#!/bin/sh\n{body}\n")
    podman.chmod(0o755)
    return str(podman)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT])
def test_podman_killed_by_a_signal_is_128_plus_n(tmp_path, signum):
    podman = _stand_in(tmp_path, f"kill -{signum.name[3:]} $$; sleep 5")
    assert taskrun.run_plan(_plan(podman), None, {"PATH": "/usr/bin:/bin"}) == 128 + signum


def test_an_exit_code_is_passed_through_and_podmans_environment_applied(tmp_path):
    out = tmp_path / "out"
    podman = _stand_in(tmp_path, f'echo "$XDG_CONFIG_HOME ${{XDG_RUNTIME_DIR-unset}} $*" > {out}; exit 3')
    assert taskrun.run_plan(_plan(podman, "c", "true"), None, {"XDG_RUNTIME_DIR": "/run/x", "PATH": "/bin"}) == 3
    assert out.read_text() == "/c unset exec c true\n"


def test_a_missing_podman_is_127(tmp_path):
    assert taskrun.run_plan(_plan(str(tmp_path / "none")), None, {}) == 127


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP])
def test_the_signals_a_task_gets_reach_its_command_and_its_code_says_which(tmp_path, signum):
    """srun and scancel signal the task (the podman-hpc process): it passes them on and
    reports the command's death by signal N as 128 + N."""
    started = tmp_path / "started"
    podman = _stand_in(tmp_path, f"touch {started}; exec sleep 30")
    script = (f"import sys; from jupyter_podman_hpc.engine import taskrun; "
              f"sys.exit(taskrun.run_plan({_plan(podman)!r}, None, {{}}))")
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
    script = (f"import os, sys; from jupyter_podman_hpc.engine import taskrun; "
              f"sys.exit(taskrun.run_plan({_plan(podman)!r}, None, dict(os.environ)))")
    subprocess.run([sys.executable, "-c", script], env={**os.environ, "PMI_FD": str(read_end)},
                   pass_fds=(read_end,), check=True, timeout=30)
    os.close(read_end)
    assert out.read_text() == "3 pmi\n"
    assert stepsocket.pmi_fd_args({"PMI_FD": "7"}) == ["--preserve-fds", "1"] and stepsocket.pmi_fd_args({}) == []


def test_a_subprocess_code_reads_as_a_shells():
    assert [stepsocket.shell_code(code) for code in (0, 3, -15, -9)] == [0, 3, 143, 137]
