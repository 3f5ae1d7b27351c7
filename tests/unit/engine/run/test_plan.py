"""How a shared-run task enters its node's container, and whether its job's steps share it: the flags beat
the settings."""

import pytest

from jupyter_podman_hpc.engine.run.plan import wants_join, wants_reuse
from jupyter_podman_hpc.engine.site.config import ConfigError, load_config


def test_tasks_join_unless_told_to_use_podman_exec():
    assert load_config({}).shared_run_exec_mode == "join"
    assert load_config({"PODMANHPC_SHARED_RUN_EXEC_MODE": "podman"}).shared_run_exec_mode == "podman"
    assert wants_join([], "join") is True
    assert wants_join([], "podman") is False
    assert wants_join(["-e", "X=1", "--join"], "podman") is True
    assert wants_join(["--no-join"], "join") is False
    assert wants_join(["--no-join", "--join"], "podman") is True  # the last one given wins


def test_a_jobs_steps_share_the_container_only_when_asked():
    assert load_config({}).shared_run_reuse is False
    config = load_config({"PODMANHPC_SHARED_RUN_REUSE": "true", "PODMANHPC_SHARED_RUN_REUSE_LINGER": "5"})
    assert (config.shared_run_reuse, config.shared_run_reuse_linger) == (True, 5.0)
    with pytest.raises(ConfigError, match=r"shared_run_reuse .* must be true or false, not 'maybe'"):
        load_config({"PODMANHPC_SHARED_RUN_REUSE": "maybe"})
    with pytest.raises(ConfigError, match=r"shared_run_reuse_linger .* must be positive"):
        load_config({"PODMANHPC_SHARED_RUN_REUSE_LINGER": "0"})
    assert wants_reuse([], False) is False and wants_reuse([], True) is True
    assert wants_reuse(["--join", "--reuse"], False) is True
    assert wants_reuse(["--reuse", "--no-reuse"], True) is False  # the last one given wins
