"""Joining a container: the capability call goes through libc, so it is right on every machine."""

import multiprocessing

from jupyter_podman_hpc.engine import join


def _in_child(target):
    """Run ``target`` in a child process (capability changes are irreversible); its result."""
    with multiprocessing.get_context("fork").Pool(1) as pool:
        return pool.apply(target)


def _set_own_caps():
    caps = join._credentials("self").caps
    join._set_caps(caps)  # setting the capabilities one has is always allowed
    return join._credentials("self").caps == caps


def _drop_then_raise():
    caps = join._credentials("self").caps
    join._set_caps({**caps, "CapEff": 0, "CapPrm": 0, "CapInh": 0})
    dropped = join._credentials("self").caps
    try:  # a permitted set can only shrink, for root too
        join._set_caps({**caps, "CapEff": caps["CapBnd"], "CapPrm": caps["CapBnd"]})
    except join.JoinFailed as err:
        return dropped["CapPrm"], str(err)
    return dropped["CapPrm"], "no error"


def test_capset_sets_the_capabilities_one_has():
    assert _in_child(_set_own_caps)


def test_capset_drops_capabilities_and_refuses_to_raise_them_with_a_message():
    assert _in_child(_drop_then_raise) == (0, "setting capabilities: Operation not permitted")
