"""Site configuration: podman-hpc's keys, precedence, templates and errors."""

import os

import pytest

from jupyter_podman_hpc.engine.errors import ConfigError
from jupyter_podman_hpc.engine.site.config import load_config


def config_file(tmp_path, text):
    path = tmp_path / "podman_hpc.yaml"
    path.write_text(text)
    return {"PODMANHPC_CONFIG_FILE": str(path)}


def test_defaults_follow_podman_hpc():
    config = load_config({})
    uid = os.getuid()
    assert config.graph_root == f"/tmp/{uid}_hpc/storage"
    assert config.run_root == f"/tmp/{uid}_hpc"
    assert config.shared_run_command == ["sleep", "infinity"]
    assert config.localid_var == "SLURM_LOCALID"
    assert config.use_default_args is True
    assert config.sources["graph_root"] == "default"


def test_precedence_default_file_template_env_template_file_env(tmp_path):
    env = config_file(tmp_path, "run_root_template: /file-template/{{ uid }}\n")
    assert load_config(env).run_root == f"/file-template/{os.getuid()}"
    env["PODMANHPC_RUN_ROOT_TEMPLATE"] = "/env-template/{{ user }}"
    config = load_config(env)
    assert (
        config.run_root.startswith("/env-template/")
        and config.sources["run_root"] == "env: PODMANHPC_RUN_ROOT_TEMPLATE"
    )
    env.update(config_file(tmp_path, "run_root_template: /file-template\nrun_root: /file-value\n"))
    assert load_config(env).run_root == "/file-value"  # a plain value beats any template
    env["PODMANHPC_RUN_ROOT"] = "/env-value"
    config = load_config(env)
    assert config.run_root == "/env-value" and config.sources["run_root"] == "env: PODMANHPC_RUN_ROOT"


def test_templates_take_environment_variables_with_underscores(tmp_path):
    env = {"MY_SCRATCH": "/scratch/me", "PODMANHPC_GRAPH_ROOT_TEMPLATE": "{{ env.MY_SCRATCH }}/{{ uid }}"}
    assert load_config(env).graph_root == f"/scratch/me/{os.getuid()}"


def test_template_with_unset_variable_is_an_error_naming_it():
    with pytest.raises(ConfigError, match="NOPE is not set"):
        load_config({"PODMANHPC_GRAPH_ROOT_TEMPLATE": "/x/{{ env.NOPE }}"})


def test_unknown_key_in_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'graph_rot'"):
        load_config(config_file(tmp_path, "graph_rot: /x\n"))


def test_lists_from_variables_are_comma_separated():
    config = load_config({"PODMANHPC_SHARED_RUN_EXEC_ARGS": "-e,SLURM_*", "PODMANHPC_ADDITIONAL_STORES": "/a,/b"})
    assert config.shared_run_exec_args == ["-e", "SLURM_*"]
    assert config.additional_stores == ["/a", "/b"]


def test_booleans_and_numbers_from_variables_are_parsed():
    # podman-hpc 1.2.2 turns the defaults off for *any* value, even "true"
    assert load_config({"PODMANHPC_USE_DEFAULT_ARGS": "true"}).use_default_args is True
    assert load_config({"PODMANHPC_USE_DEFAULT_ARGS": "0"}).use_default_args is False
    assert load_config({"PODMANHPC_WAIT_TIMEOUT": "2.5"}).wait_timeout == 2.5
    with pytest.raises(ConfigError, match="wait_timeout"):
        load_config({"PODMANHPC_WAIT_TIMEOUT": "soon"})
    with pytest.raises(ConfigError, match="use_default_args"):
        load_config({"PODMANHPC_USE_DEFAULT_ARGS": "maybe"})


def test_squash_dir_from_scratch_variable_option_and_config(tmp_path):
    assert load_config({"SCRATCH": "/pscratch/me"}).squash_dir == "/pscratch/me/storage"
    env = {"SCRATCH": "/pscratch/me", "PODMANHPC_SQUASH_DIR": "/from/podmanhpc", "SQUASH_DIR": "/from/squash_dir"}
    assert load_config(env).squash_dir == "/from/squash_dir"
    config = load_config(env, squash_dir="/from/option")
    assert config.squash_dir == "/from/option" and config.sources["squash_dir"] == "option: --squash-dir"


def test_explicit_config_file_must_exist(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config({"PODMANHPC_CONFIG_FILE": str(tmp_path / "missing.yaml")})


def test_podman_env_hides_runtime_dir_and_user_config():
    config = load_config({})
    env = config.podman_env({"XDG_RUNTIME_DIR": "/run/user/1", "HOME": "/h"})
    assert "XDG_RUNTIME_DIR" not in env
    assert env["XDG_CONFIG_HOME"] == config.config_home and env["HOME"] == "/h"


def test_without_scratch_there_is_no_shared_fallback_store():
    config = load_config({})
    assert config.squash_dir == ""  # podman-hpc 1.2.2 would use /tmp/storage, shared by every user
    from jupyter_podman_hpc.engine.store.access import configured_stores
    from jupyter_podman_hpc.engine.store.squashed import SquashStore

    assert configured_stores(config) == []
    with pytest.raises(ConfigError, match="no squashed image store: SCRATCH is not set"):
        SquashStore(config.squash_dir)
    assert load_config({"SCRATCH": "/scratch/u"}).squash_dir == "/scratch/u/storage"


def test_a_yaml_syntax_error_is_one_line_with_its_place(tmp_path):
    env = config_file(tmp_path, "log_level: error\nulimits: [nofile=1024:1024\nnetwork: host\n")
    with pytest.raises(ConfigError) as refused:
        load_config(env)
    assert str(refused.value) == (
        f"configuration file {tmp_path / 'podman_hpc.yaml'} is not valid YAML: "
        "line 3, column 8: expected ',' or ']', but got ':'"
    )
