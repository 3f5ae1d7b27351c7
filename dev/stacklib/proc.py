"""Running commands and supervising the stack's daemons by pid file.

A pid file records the pid and the kernel's start time of the process, so a
pid reused by an unrelated process after a crash is never mistaken for ours.
The stack is built by the system's python3 before any package is installed,
so this reads /proc itself instead of using psutil as the package does.
"""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .layout import LOG, RUN


def say(message: str) -> None:
    print(f"[stack] {message}", flush=True)


def run(
    args: Sequence[str],
    *,
    check: bool = True,
    quiet: bool = False,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess:
    """Run a command; on failure show its output and raise."""
    result = subprocess.run(list(args), text=True, capture_output=True, env=env, input=input, cwd=cwd)
    if check and result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"[stack] command failed ({result.returncode}): {' '.join(args)}")
    if not quiet and result.stdout.strip() and os.environ.get("STACK_VERBOSE"):
        print(result.stdout, end="")
    return result


def succeeds(args: Sequence[str], **kwargs) -> bool:
    try:
        return subprocess.run(list(args), capture_output=True, **kwargs).returncode == 0
    except FileNotFoundError:
        return False


def as_user(user: str, args: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """The command line that runs ``args`` as ``user`` with a clean environment."""
    pairs = [f"{k}={v}" for k, v in (env or {}).items()]
    return ["runuser", "-u", user, "--", "env", "-i", *pairs, *args]


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces; fields after it are fixed.
    return stat.rsplit(")", 1)[1].split()[19]


def pidfile(name: str) -> Path:
    return RUN / f"{name}.pid"


def running_pid(name: str) -> int | None:
    """The pid of daemon ``name`` if the process we started is still alive.

    A zombie is not: a daemon just killed (a node's power loss) keeps its pid and start
    time until pid 1, its parent by then, reaps it.
    """
    try:
        pid_text, start = pidfile(name).read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    return pid if _start_time(pid) == start and not exited(pid) else None


def start_daemon(
    name: str,
    args: Sequence[str],
    env: Mapping[str, str] | None = None,
    ready: Callable[[], bool] | None = None,
    timeout: float = 60,
) -> None:
    """Start ``args`` (a process that stays in the foreground) in its own session.

    Its output goes to the stack's log directory. Waits until ``ready()``
    holds; a daemon that exits or never becomes ready is an error.
    """
    RUN.mkdir(parents=True, exist_ok=True)
    LOG.mkdir(parents=True, exist_ok=True)
    log = open(LOG / f"{name}.out", "ab")
    proc = subprocess.Popen(
        list(args),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        env=dict(env) if env is not None else None,
        start_new_session=True,
    )
    log.close()
    start = None
    while start is None and proc.poll() is None:
        start = _start_time(proc.pid)
    pidfile(name).write_text(f"{proc.pid} {start}\n")
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            pidfile(name).unlink(missing_ok=True)
            tail = (LOG / f"{name}.out").read_text(errors="replace")[-2000:]
            raise SystemExit(f"[stack] {name} exited ({proc.returncode}) while starting:\n{tail}")
        if ready is None or ready():
            return
        if time.monotonic() > deadline:
            stop_daemon(name)
            raise SystemExit(f"[stack] {name} did not become ready in {timeout:.0f} s; see {LOG}/{name}.out")
        time.sleep(0.2)


def stop_daemon(name: str, timeout: float = 15) -> bool:
    """Stop the daemon we started under ``name``; True if one was running."""
    pid = running_pid(name)
    pidfile(name).unlink(missing_ok=True)
    if pid is None:
        return False
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if exited(pid):
                return True
            time.sleep(0.1)
    return True


def exited(pid: int) -> bool:
    """The process is gone, or a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_for(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"[stack] timed out waiting for {what}")
        time.sleep(0.3)


def write_if_changed(path: Path, text: str, mode: int = 0o644) -> bool:
    """Write ``text`` atomically unless the file already holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text() == text:
        os.chmod(path, mode)
        return False
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return True
