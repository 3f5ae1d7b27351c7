"""`jupyter podman-hpc kernel install|list|remove`: output, one-line errors, exit codes."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_podman_hpc.kernels.cli import main

IMAGE = "127.0.0.1:5000/jph/base:bookworm"


def test_install_list_remove(prefix, capsys):
    assert (
        main(
            [
                "kernel",
                "install",
                IMAGE,
                "--name",
                "base",
                "--display-name",
                "Base",
                "--module",
                "home",
                "--module",
                "scratch",
                "--prefix",
                str(prefix),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "installed kernel base (Base)" in out
    spec = json.loads((prefix / "share/jupyter/kernels/base/kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"]["config"]["modules"] == ["home", "scratch"]

    assert main(["kernel", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "IMAGE", "MODULES", "POOL", "PATH"]
    assert lines[1].split()[:4] == ["base", IMAGE, "home,scratch", "-"]

    assert main(["kernel", "list", "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert listed["name"] == "base" and listed["image"] == IMAGE

    assert main(["kernel", "remove", "base"]) == 0
    assert "removed kernel base" in capsys.readouterr().out
    assert not (prefix / "share/jupyter/kernels/base").exists()


def test_pool_size_and_slurm_opt_out(prefix, capsys):
    assert (
        main(["kernel", "install", IMAGE, "--name", "pooled", "--pool", "2", "--no-slurm", "--prefix", str(prefix)])
        == 0
    )
    config = json.loads((prefix / "share/jupyter/kernels/pooled/kernel.json").read_text())["metadata"][
        "kernel_provisioner"
    ]["config"]
    assert config["pool"] == 2 and config["slurm"] is False
    capsys.readouterr()
    assert main(["kernel", "list", "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert listed["pool"] == 2 and listed["slurm"] is False


@pytest.mark.parametrize("size", ["-1", "17", "two"])
def test_bad_pool_size_is_one_line(prefix, capsys, size):
    code = main(["kernel", "install", IMAGE, "--name", "bad", "--pool", size, "--prefix", str(prefix)])
    err = capsys.readouterr().err
    assert code in (1, 2) and len(err.strip().splitlines()) == 1 and "pool" in err
    assert not (prefix / "share/jupyter/kernels/bad").exists()


def test_default_install_is_the_user_data_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    assert main(["kernel", "install", IMAGE, "--user"]) == 0
    assert (tmp_path / "data/kernels/podman-hpc-127.0.0.1-5000-jph-base-bookworm/kernel.json").is_file()


@pytest.mark.parametrize(
    "argv, code, message",
    [
        (["kernel", "install", "Bad Image"], 1, "invalid image reference"),
        (["kernel", "install", IMAGE, "--name", "Bad/Name"], 1, "invalid kernel name"),
        (["kernel", "install", IMAGE, "--module", "nosuch"], 1, "unknown module 'nosuch'"),
        (["kernel", "install"], 2, "the following arguments are required: IMAGE"),
        (["kernel", "install", IMAGE, "--user", "--sys-prefix"], 2, "not allowed with argument"),
        (["kernel", "remove", "nothere"], 1, "no podman-hpc kernel named nothere"),
        (["kernel", "frobnicate"], 2, "invalid choice: 'frobnicate'"),
        (["kernel"], 2, "usage: jupyter podman-hpc kernel install|list|remove"),
        (["--bogus"], 2, "unrecognized arguments: --bogus"),
    ],
)
def test_bad_input_is_one_line_and_a_non_zero_exit(prefix, capsys, argv, code, message):
    assert main(argv) == code
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("jupyter podman-hpc: error: ")
    assert message in lines[0]


def test_jupyter_finds_the_subcommand(prefix):
    jupyter = shutil.which("jupyter", path=str(Path(sys.executable).parent))
    if jupyter is None:
        pytest.skip("no jupyter command beside this python")
    env = {
        "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
        "JUPYTER_PATH": str(prefix / "share" / "jupyter"),
        "HOME": str(prefix),
    }
    result = subprocess.run(
        [jupyter, "podman-hpc", "kernel", "install", IMAGE, "--name", "via-jupyter", "--prefix", str(prefix)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    listed = subprocess.run(
        [jupyter, "podman-hpc", "kernel", "list"], capture_output=True, text=True, env=env, timeout=60
    )
    assert "via-jupyter" in listed.stdout
    bad = subprocess.run(
        [jupyter, "podman-hpc", "kernel", "remove", "Nope"], capture_output=True, text=True, env=env, timeout=60
    )
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "invalid kernel name" in bad.stderr
