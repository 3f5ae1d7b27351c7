"""The project's wheel, installed as a site installs it (docs/operators/site.md): into a clean
virtual environment of Debian's python3, from the wheelhouse dev/stack fills, with no
index and no npm. Its Jupyter extensions are enabled and OK, every piece of package
data is there, and its console scripts work from that environment."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers.commands import run

pytestmark = pytest.mark.slow

CHECKOUT = Path(__file__).resolve().parents[3]
PACKAGE = "jupyter_podman_hpc"
# Tools an install must not run: a wheel is installed by unpacking it, never by building.
BUILD_TOOLS = ("npm", "npx", "node", "jlpm", "yarn")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _tracked(*paths: str) -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(CHECKOUT), "-c", f"safe.directory={CHECKOUT}", "ls-files", "--", *paths],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()


@pytest.fixture(scope="module")
def installed(stack, wheelhouse, tmp_path_factory):
    """(venv, environment, npm trap log): the wheel installed offline into a fresh venv."""
    root = tmp_path_factory.mktemp("wheel")
    trap, calls = root / "trap", root / "build-tool-calls"
    trap.mkdir()
    for tool in BUILD_TOOLS:
        script = trap / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\nexit 1\n')
        script.chmod(0o755)
    venv = root / "venv"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("JUPYTER", "PIP_"))}
    env.update(
        PATH=f"{venv}/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        # no pip configuration of this machine: the wheelhouse is the only source
        PIP_CONFIG_FILE=os.devnull,
        JUPYTER_PLATFORM_DIRS="1",
        HOME=str(root / "home"),
        XDG_CONFIG_HOME=str(root / "home" / ".config"),
    )
    env["PYTHONSAFEPATH"] = "1"  # `python -c` would import the checkout from the current directory
    run(["/usr/bin/python3", "-m", "venv", venv], env=env, cwd=root)
    # the commands of docs/operators/site.md, "Install from the wheel"
    trapped = {**env, "PATH": f"{trap}:{env['PATH']}"}
    run(
        [venv / "bin" / "pip", "install", "--no-index", "--find-links", wheelhouse, "jupyter-podman-hpc"],
        env=trapped,
        cwd=root,
        timeout=600,
    )
    return venv, env, calls


def _site_packages(venv: Path) -> Path:
    found = list((venv / "lib").glob("python3*/site-packages"))
    assert len(found) == 1, found
    return found[0]


def test_installs_offline_without_npm_and_not_editable(installed, wheelhouse):
    venv, env, calls = installed
    assert not calls.exists(), f"the install ran a build tool: {calls.read_text()}"
    assert [p.name for p in wheelhouse.glob("jupyter_podman_hpc-*")] == [
        p.name for p in wheelhouse.glob("jupyter_podman_hpc-*.whl")
    ], "the wheelhouse holds a source archive"
    where = run([venv / "bin" / "python", "-c", f"import {PACKAGE}; print({PACKAGE}.__file__)"], env=env).stdout
    assert Path(where.strip()).is_relative_to(_site_packages(venv)), where
    dist_info = list(_site_packages(venv).glob("jupyter_podman_hpc-*.dist-info"))
    assert len(dist_info) == 1 and not (dist_info[0] / "direct_url.json").exists(), "an editable or URL install"


def _plain(result) -> str:
    return ANSI.sub("", result.stdout + result.stderr)


def test_jupyter_extensions_enabled_and_ok(installed):
    venv, env, _ = installed
    text = _plain(run([venv / "bin" / "jupyter", "server", "extension", "list"], env=env))
    # enabled by the config file the wheel installs in the environment, and it loads
    section = text.split(f"Config dir: {venv}/etc/jupyter", 1)[-1].split("Config dir:", 1)[0]
    assert re.search(rf"^\s+{PACKAGE} enabled$", section, re.M), text
    assert re.search(rf"^\s+{PACKAGE} \S+ OK$", section, re.M), text
    text = _plain(run([venv / "bin" / "jupyter", "labextension", "list"], env=env))
    section = text.split(str(venv / "share" / "jupyter" / "labextensions"), 1)[-1]
    assert re.search(r"^\s+jupyter-podman-hpc v\S+ enabled OK", section, re.M), text


def test_every_piece_of_package_data_is_installed(installed):
    venv, _, _ = installed
    package = _site_packages(venv) / PACKAGE
    data = [name for name in _tracked(PACKAGE) if not name.endswith(".py")]
    # what the brief names, so that a moved file fails here rather than pass by absence
    for expected in ("engine/site/data/modules.d/", "engine/site/data/slurm/uid.c", "engine/site/data/slurm/client"):
        assert any(name.startswith(f"{PACKAGE}/{expected}") for name in data), expected
    missing = [name for name in data if not (package.parent / name).is_file()]
    assert not missing, missing
    assert os.access(package / "engine" / "site" / "data" / "slurm" / "client", os.X_OK)
    logos = _tracked("kernels")
    assert logos
    missing = [name for name in logos if not (package / "kernels" / "resources" / Path(name).name).is_file()]
    assert not missing, missing
    for script in ("podman-hpc", "podman-hpc-mount", "podman-hpc-hook", "jupyter-podman-hpc"):
        assert os.access(venv / "bin" / script, os.X_OK), script
    labext = venv / "share" / "jupyter" / "labextensions" / "jupyter-podman-hpc"
    assert (labext / "package.json").is_file() and (labext / "install.json").is_file()
    assert list((labext / "static").glob("remoteEntry.*.js"))
    assert (venv / "etc" / "jupyter" / "jupyter_server_config.d" / "jupyter_podman_hpc.json").is_file()


def test_podman_hpc_runs_from_the_environment(installed, stack):
    venv, env, _ = installed
    version = run([venv / "bin" / "podman-hpc", "--version"], env=env).stdout
    assert re.fullmatch(r"podman-hpc version \S+ \(jupyter-podman-hpc\)\n", version), version
    info = run([venv / "bin" / "podman-hpc", "infohpc"], env=env).stdout
    package = _site_packages(venv) / PACKAGE
    assert f"modules ({package / 'engine' / 'site' / 'data' / 'modules.d'}):" in info, info
    assert f"mount_program (default): {venv / 'bin' / 'podman-hpc-mount'}" in info, info
    assert " - openmpi-pmix: " in info, info
