"""Corrupt inputs on the real stack: a truncated squash file, a podman_hpc.yaml with a YAML
syntax error, a modules.d file with an unknown key, a kernelspec edited to nonsense, a truncated
job record. Each fault is injected for real; the user gets one line naming the file and what is
wrong, nothing is left mounted or running, the other kernelspecs and jobs are still listed, and
once the fault is gone the same command works."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from jupyter_podman_hpc.engine.site.config import SITE_DATA
from tests.helpers.commands import run
from tests.helpers.faults import one_line, own_mounts

pytestmark = [pytest.mark.faults, pytest.mark.integration]

SITE_MODULES = SITE_DATA / "modules.d"


def squash_files(hpc) -> list[Path]:
    return sorted((hpc.squash_dir / "overlay" / "l").glob("*.squash"))


def test_a_truncated_squash_file_is_one_line_naming_it_and_a_new_squash_runs(hpc, stack):
    hpc("pull", stack.tiny_image)
    hpc.wipe_local_storage()  # as on a node that never pulled it: the container reads the squash file
    (squash,) = squash_files(hpc)
    size = squash.stat().st_size
    os.truncate(squash, size // 2)  # a copy that stopped half-way

    result = hpc("run", "--rm", stack.tiny_image, "true", check=False)
    assert result.returncode != 0
    line = one_line(result.stderr)
    assert str(squash) in line and f"is damaged: it is truncated ({size // 2} of its " in line, line
    assert "mount_data" not in line
    assert own_mounts(hpc) == []
    assert hpc("ps", "-a", "--format", "{{.Names}}").stdout.strip() == ""

    hpc("pull", stack.tiny_image)  # what the line says: squash it again
    hpc.wipe_local_storage()
    assert squash.stat().st_size == size
    assert hpc("run", "--rm", stack.tiny_image, "cat", "/etc/os-release").stdout.startswith('NAME="jph tiny"')
    assert own_mounts(hpc) == []


def test_a_podman_hpc_yaml_with_a_syntax_error_is_one_line_with_its_place(hpc, stack):
    config = hpc.work / "podman_hpc.yaml"
    config.write_text("log_level: error\nulimits: [nofile=1024:1024\nnetwork: host\n")
    env = {**hpc.env, "PODMANHPC_CONFIG_FILE": str(config)}
    result = run(["podman-hpc", "images"], env=env, check=False)
    assert result.returncode == 125
    assert one_line(result.stderr) == (
        f"Error: configuration file {config} is not valid YAML: line 3, column 8: expected ',' or ']', but got ':'"
    )
    assert result.stdout == ""

    config.write_text("log_level: error\nulimits: [nofile=1024:1024]\nnetwork: host\n")
    assert run(["podman-hpc", "images"], env=env).stdout.startswith("REPOSITORY:TAG")


def test_a_module_file_with_an_unknown_key_is_one_line_naming_it(hpc, stack):
    hpc("pull", stack.tiny_image)
    modules = hpc.work / "modules.d"
    shutil.copytree(SITE_MODULES, modules)
    broken = modules / "scratch.yaml"
    text = broken.read_text()
    broken.write_text(text + "mounts:\n  - /scratch\n")
    env = {**hpc.env, "PODMANHPC_MODULES_DIR": str(modules)}
    result = run(["podman-hpc", "run", "--rm", stack.tiny_image, "true"], env=env, check=False)
    assert result.returncode == 125
    line = one_line(result.stderr)
    assert line.startswith(f"Error: module file {broken}: unknown key 'mounts' (a module's keys: "), line
    assert hpc("ps", "-a", "--format", "{{.Names}}").stdout.strip() == ""

    broken.write_text(text)
    run(["podman-hpc", "run", "--rm", stack.tiny_image, "true"], env=env)


# --- kernelspecs ------------------------------------------------------------------------------


NONSENSE = {
    "not JSON": ('{"argv": ["python3", "-m", "ipykernel_launcher"', "is not valid JSON (line 1, column 48)"),
    "not an object": ('["hello"]', "is not a JSON object"),
    "no image": (None, "it names no image (metadata.kernel_provisioner.config.image)"),
}


def break_kernelspec(path: Path, nonsense: str | None) -> None:
    if nonsense is None:  # ours, with its config edited to something else
        spec = json.loads(path.read_text())
        spec["metadata"]["kernel_provisioner"]["config"] = {"imgae": "typo"}
        nonsense = json.dumps(spec)
    path.write_text(nonsense)


@pytest.mark.parametrize("kind", list(NONSENSE))
def test_a_kernelspec_edited_to_nonsense_is_one_line_and_the_others_are_listed(stack, tmp_path, kind):
    env = {
        **os.environ,
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "JUPYTER_PATH": str(tmp_path / "data"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        "JUPYTER_PLATFORM_DIRS": "0",
    }
    for name in ("good", "edited"):
        run(["jupyter", "podman-hpc", "kernel", "install", stack.tiny_image, "--name", name], env=env)
    spec = tmp_path / "data" / "kernels" / "edited" / "kernel.json"
    nonsense, what = NONSENSE[kind]
    break_kernelspec(spec, nonsense)

    listed = run(["jupyter", "podman-hpc", "kernel", "list", "--json"], env=env)
    assert [k["name"] for k in json.loads(listed.stdout)] == ["good"]
    line = one_line(listed.stderr)
    assert line.startswith(f"jupyter podman-hpc: warning: kernelspec {spec}") and what in line, line
    table = run(["jupyter", "podman-hpc", "kernel", "list"], env=env)
    assert [row.split()[0] for row in table.stdout.splitlines()] == ["NAME", "good"]

    # installing it again is the retry: it replaces the broken one
    run(["jupyter", "podman-hpc", "kernel", "install", stack.tiny_image, "--name", "edited"], env=env)
    listed = run(["jupyter", "podman-hpc", "kernel", "list", "--json"], env=env)
    assert [k["name"] for k in json.loads(listed.stdout)] == ["edited", "good"] and listed.stderr == ""
