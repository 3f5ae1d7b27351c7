"""Process facts through psutil, on real processes of this test."""

import json
import os
import subprocess
import sys
import time

from jupyter_podman_hpc.engine.base import processes


def test_a_process_is_running_until_it_exits_even_as_a_zombie():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    started = processes.start_time(child.pid)
    assert processes.running(child.pid) and started is not None
    assert processes.start_time(child.pid) == started  # stable: it tells this process from a later one
    child.stdin.close()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert not processes.running(child.pid) and processes.start_time(child.pid) is None
    child.wait()
    assert not processes.running(child.pid) and processes.cmdline(child.pid) == []


def test_descendants_walks_the_process_table():
    table = {10: 1, 11: 10, 12: 11, 13: 10, 20: 1}
    assert processes.descendants(10, table) == [11, 13, 12]
    assert processes.descendants(20, table) == []
    assert os.getpid() in processes.descendants(os.getppid())


def test_open_files_under_a_directory(tmp_path):
    inside, outside = tmp_path / "in" / "held", tmp_path / "held-outside"
    inside.parent.mkdir()
    with open(inside, "w"), open(outside, "w"):
        assert processes.open_files_under([os.getpid()], [str(tmp_path / "in")]) == [str(inside)]
    assert processes.open_files_under([os.getpid()], [str(tmp_path / "in")]) == []


def test_an_owner_token_names_one_process_not_its_pid():
    token = processes.owner_token()
    pid, _, start = token.partition(":")
    assert int(pid) == os.getpid() and processes.owner_alive(token) and processes.owner_alive(pid)
    assert not processes.owner_alive(f"{pid}:{float(start) + 1:.2f}")  # same pid, another process
    assert not processes.owner_alive("garbage") and not processes.owner_alive("")


def test_wait_any_returns_the_first_process_to_exit_or_a_wake_up():
    sleepers = [
        subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        for _ in range(2)
    ]
    tokens = [processes.owner_token(child.pid) for child in sleepers]
    try:
        sleepers[1].stdin.close()
        assert processes.wait_any(tokens) == tokens[1]
        sleepers[1].wait()
        assert processes.wait_any(tokens) == tokens[1]  # gone already: at once
        read_end, write_end = os.pipe()
        os.write(write_end, b"x")
        assert processes.wait_any(tokens[:1], wake_fds=[read_end]) is None
        os.close(read_end)
        os.close(write_end)
    finally:
        for child in sleepers:
            child.kill()
            child.wait()


def test_ancestor_pidfd_finds_the_nearest_ancestor_by_name(tmp_path):
    """As the first task finds its step's slurmstepd: a shell renamed so stands in for it."""
    stepd = tmp_path / "slurmstepd"
    stepd.symlink_to("/bin/sh")  # the kernel names a process after the file it executes
    probe = (
        "import os; from jupyter_podman_hpc.engine.base import processes; "
        "fd = processes.ancestor_pidfd('slurmstepd'); "
        "print(os.getppid(), fd is not None and "
        "[l.split()[1] for l in open(f'/proc/self/fdinfo/{fd}') if l.startswith('Pid:')][0], "
        "processes.ancestor_pidfd('no-such-ancestor'))"
    )
    out = subprocess.run(
        [str(stepd), "-c", '"$0" -c "$1"; true', sys.executable, probe], capture_output=True, text=True, check=True
    ).stdout.split()
    parent, found, missing = out
    assert found == parent  # the shell called slurmstepd, through its pidfd
    assert missing == "None"


def test_an_owner_token_counts_clock_ticks_since_boot_and_reads_an_earlier_versions_token():
    token = processes.owner_token()
    pid, _, start = token.partition(":")
    assert int(pid) == os.getpid() and start.isdigit() and processes.owner_alive(token)
    assert not processes.owner_alive(f"{pid}:{int(start) + 1}")  # a later process given the same pid
    import psutil

    earlier = f"{pid}:{psutil.Process().create_time():.2f}"  # what tokens held before
    assert processes.owner_alive(earlier) and not processes.owner_alive(f"{pid}:1.00")


def test_a_runc_init_is_orphaned_unless_a_conmon_or_runc_is_its_parent(tmp_path):
    """Processes whose command lines are ``runc init`` and ``conmon``: an interpreter run under those names
    (the real case, a conmon killed under its waiting ``runc init``, is tests/integration/engine/test_processes.py)."""
    for name in ("runc", "conmon"):
        (tmp_path / name).symlink_to(sys.executable)
    (tmp_path / "init").write_text("import sys; sys.stdin.read()\n")
    (tmp_path / "parent").write_text(
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.argv[1], 'init'], stdin=subprocess.PIPE)\n"
        "print(child.pid, flush=True)\n"
        "sys.stdin.read()\n"
        "child.stdin.close(); child.wait()\n"
    )
    alone = subprocess.Popen([tmp_path / "runc", "init"], cwd=tmp_path, stdin=subprocess.PIPE)
    conmon = subprocess.Popen(
        [tmp_path / "conmon", "parent", tmp_path / "runc"],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    below_conmon = int(conmon.stdout.readline())
    try:
        orphans = processes.orphaned_runc_inits()
        assert alone.pid in orphans  # its parent is this test, neither conmon nor runc
        assert below_conmon not in orphans
    finally:
        for process in (alone, conmon):
            process.stdin.close()
            process.wait(timeout=10)


def _ancestors(pid: int) -> list[int]:
    chain = []
    while pid > 1:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
        pid = int(text[text.rindex(")") + 2 :].split()[1])
        chain.append(pid)
    return chain


def test_a_detached_process_goes_on_only_once_it_has_left_the_callers_process_tree(monkeypatch):
    """Slurm SIGKILLs a cancelled step's process tree: a monitor must not begin its work while it is
    still in it, however late the intermediate process exits (here 0.5 s late)."""
    caller, real_fork = os.getpid(), os.fork

    def slow_intermediate_fork():
        pid = real_fork()
        if pid != 0 and os.getpid() != caller:  # the intermediate process, having forked the new one
            time.sleep(0.5)
        return pid

    monkeypatch.setattr(os, "fork", slow_intermediate_fork)
    read_end, write_end = os.pipe()
    if processes.detach():
        os.write(write_end, json.dumps([os.getsid(0) != os.getsid(caller), caller in _ancestors(os.getpid())]).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as reply:
        other_session, in_callers_tree = json.loads(reply.read())
    assert other_session and not in_callers_tree
