"""How a shared-run task enters its node's container: the flags beat the setting."""

from jupyter_podman_hpc.engine.config import load_config
from jupyter_podman_hpc.engine.runplan import wants_join


def test_tasks_join_unless_told_to_use_podman_exec():
    assert load_config({}).shared_run_exec_mode == "join"
    assert load_config({"PODMANHPC_SHARED_RUN_EXEC_MODE": "podman"}).shared_run_exec_mode == "podman"
    assert wants_join([], "join") is True
    assert wants_join([], "podman") is False
    assert wants_join(["-e", "X=1", "--join"], "podman") is True
    assert wants_join(["--no-join"], "join") is False
    assert wants_join(["--no-join", "--join"], "podman") is True  # the last one given wins
