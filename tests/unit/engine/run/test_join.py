"""Joining a container: the capability call goes through libc, so it is right on every machine."""

import multiprocessing
import os

import pytest

from jupyter_podman_hpc.engine.run import join


def _in_child(target):
    """Run ``target`` in a child process (capability changes are irreversible); its result."""
    with multiprocessing.get_context("fork").Pool(1) as pool:
        return pool.apply(target)


def _own():
    return os.open("/proc/self", os.O_RDONLY | os.O_DIRECTORY)


def _set_own_caps():
    caps = join._credentials(_own()).caps
    join._set_caps(caps)  # setting the capabilities one has is always allowed
    return join._credentials(_own()).caps == caps


def _drop_then_raise():
    caps = join._credentials(_own()).caps
    join._set_caps({**caps, "CapEff": 0, "CapPrm": 0, "CapInh": 0})
    dropped = join._credentials(_own()).caps
    try:  # a permitted set can only shrink, for root too
        join._set_caps({**caps, "CapEff": caps["CapBnd"], "CapPrm": caps["CapBnd"]})
    except join.JoinFailed as err:
        return dropped["CapPrm"], str(err)
    return dropped["CapPrm"], "no error"


def test_capset_sets_the_capabilities_one_has():
    assert _in_child(_set_own_caps)


def test_capset_drops_capabilities_and_refuses_to_raise_them_with_a_message():
    assert _in_child(_drop_then_raise) == (0, "setting capabilities: Operation not permitted")


def _join_self():
    """Join "the container" whose first process is this very process (not in a container)."""
    pidfd = os.pidfd_open(os.getpid())
    before = [os.stat(f"/proc/self/ns/{kind}").st_ino for kind in join.NAMESPACES]
    cgroups = open("/proc/self/cgroup").read()
    try:
        join.join_and_run(pidfd, ["true"])
    except join.JoinFailed as err:
        after = [os.stat(f"/proc/self/ns/{kind}").st_ino for kind in join.NAMESPACES]
        return str(err), before == after and cgroups == open("/proc/self/cgroup").read()
    return "joined", None


def test_a_process_beside_the_task_is_no_container_and_nothing_is_entered():
    message, unchanged = _in_child(_join_self)
    assert "it is no container" in message and unchanged


def test_only_a_pidfd_names_the_process_to_join():
    with open(os.devnull) as not_a_pidfd, pytest.raises(join.JoinFailed, match="no process to join"):
        join.open_process(not_a_pidfd.fileno())
    pidfd = os.pidfd_open(os.getpid())
    proc = join.open_process(pidfd)
    assert os.readlink("exe", dir_fd=proc) == os.readlink("/proc/self/exe")  # that process, not a pid's
    assert join._namespaces(proc) == []
    os.close(proc)
    os.close(pidfd)


def _dumpable_when_entering():
    """Join "a container" (this process, its namespaces taken as another's) up to the point of
    entering it: whether the task could still be read by the container's processes then."""
    seen = []

    def enter(pidfd, proc, kinds):
        seen.append(join._libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0))
        raise join.JoinFailed("stopped before entering")

    join._namespaces = lambda proc: list(join.NAMESPACES)
    join._enter = enter
    was = join._libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0)
    try:
        join.join_and_run(os.pidfd_open(os.getpid()), ["true"])
    except join.JoinFailed:
        pass
    return was, seen


_PR_GET_DUMPABLE = 3


def test_a_task_is_out_of_the_containers_reach_before_it_enters():
    """Undumpable, the task's /proc (the job's environment) is closed to a --pid=host container."""
    assert _in_child(_dumpable_when_entering) == (1, [0])
