"""The locks of a job's node container that its steps share: one starter at a time, one lingerer, no
removal while a step holds it or within the linger of its last use, and a step that waited through a
removal starts on new files (the stack test runs real steps)."""

import fcntl
import os
import subprocess
import threading
import time

from jupyter_podman_hpc.engine.run import jobcontainer


def test_the_key_stands_for_the_job_node_and_the_whole_run_command():
    key = jobcontainer.reuse_key("7", "n2", ["-d", "IMAGE"])
    assert key.startswith("7.reuse-") and key.endswith(".n2")
    assert key == jobcontainer.reuse_key("7", "n2", ["-d", "IMAGE"])
    assert key != jobcontainer.reuse_key("7", "n2", ["-d", "-e", "X=1", "IMAGE"])
    assert key != jobcontainer.reuse_key("8", "n2", ["-d", "IMAGE"])


def lingering(directory, seconds):
    """A lingerer in a thread; the boot-clock times at which it removed the container."""
    removed = []
    thread = threading.Thread(
        target=jobcontainer.linger,
        args=(directory, seconds, lambda: removed.append(time.clock_gettime(time.CLOCK_BOOTTIME)), removed.append),
    )
    thread.start()
    return thread, removed


def last_used(directory) -> float:
    return float((directory / jobcontainer.LAST_USED).read_text())


def test_the_container_goes_once_no_step_has_used_it_for_the_linger(tmp_path):
    directory = tmp_path / "7.reuse-x.n2"
    with jobcontainer.starting(directory) as first:
        pass
    with jobcontainer.starting(directory) as second:
        pass
    first.release(directory)
    thread, removed = lingering(directory, 0.3)
    time.sleep(0.2)
    jobcontainer.linger(directory, 0.3, lambda: removed.append("the second lingerer"), removed.append)  # at once
    time.sleep(1.0)
    assert removed == [] and thread.is_alive()  # the second step still holds it
    second.release(directory)
    released = last_used(directory)
    second.release(directory)  # again: nothing
    with jobcontainer.starting(directory) as third:  # a step comes and goes within the linger
        pass
    time.sleep(0.2)
    third.release(directory)
    last = last_used(directory)
    thread.join(10)
    assert len(removed) == 1 and removed[0] >= last + 0.3 > released + 0.3
    assert not directory.exists()


def test_a_step_starting_during_the_removal_waits_and_starts_on_new_files(tmp_path):
    directory = tmp_path / "7.reuse-x.n2"
    with jobcontainer.starting(directory) as lease:
        pass
    lease.release(directory)
    removing, go_on, got = threading.Event(), threading.Event(), []

    def remove():
        removing.set()
        go_on.wait(5)

    def step():
        with jobcontainer.starting(directory) as waiting:
            got.append(os.stat(directory / jobcontainer.HOLDERS).st_ino)
            waiting.release(directory)

    lingerer = threading.Thread(target=jobcontainer.linger, args=(directory, 0.1, remove, print))
    lingerer.start()
    assert removing.wait(5)
    starter = threading.Thread(target=step)
    starter.start()
    time.sleep(0.3)
    assert not got  # it waits for create.lock while the container is removed
    go_on.set()
    lingerer.join(5)
    starter.join(5)
    assert got and (directory / jobcontainer.CREATE).exists()
    fd = os.open(directory / jobcontainer.HOLDERS, os.O_RDONLY)
    try:  # the step let go: the holders' lock is free
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_a_lingerer_first_removes_the_idle_containers_of_the_node_whose_lingerer_was_killed(tmp_path):
    orphan, lingered, busy, elsewhere, mine = (
        tmp_path / f"{job}.reuse-x.{node}"
        for job, node in (("1", "n2"), ("2", "n2"), ("3", "n2"), ("4", "n3"), ("5", "n2"))
    )
    for directory in (orphan, lingered, busy, elsewhere, mine):
        with jobcontainer.starting(directory) as lease:
            pass
        lease.release(directory)
    with jobcontainer.starting(busy):  # a step holds it
        held = os.open(lingered / jobcontainer.LINGER, os.O_RDONLY | os.O_CREAT, 0o600)
        fcntl.flock(held, fcntl.LOCK_EX)  # its lingerer runs
        try:
            time.sleep(0.2)
            removed = []
            jobcontainer.linger(mine, 0.1, lambda: removed.append("mine"), removed.append)
        finally:
            os.close(held)
    assert removed == ["1.reuse-x.n2", "mine"]
    assert not orphan.exists() and not mine.exists() and lingered.exists() and busy.exists() and elsewhere.exists()


def test_only_a_live_keep_alive_of_the_record_is_adopted(tmp_path):
    directory = tmp_path / "7.reuse-x.n2"
    directory.mkdir()
    me = ["python3", "-c", "import time; time.sleep(30)"]
    process = subprocess.Popen(me)
    try:
        assert jobcontainer.adopted(directory, me) is None  # nothing recorded
        jobcontainer.record(directory, process.pid)
        deadline = time.monotonic() + 5
        while jobcontainer.adopted(directory, me) is None and time.monotonic() < deadline:
            time.sleep(0.01)  # until python3 has exec'd
        assert jobcontainer.adopted(directory, me) == process.pid
        assert jobcontainer.adopted(directory, ["sleep", "infinity"]) is None  # another command
    finally:
        process.kill()
        process.wait()
    assert jobcontainer.adopted(directory, me) is None  # gone
    (directory / jobcontainer.KEEP_ALIVE).write_text(f"{os.getpid()}:1")  # a pid with another start
    assert jobcontainer.adopted(directory, me) is None
