"""The site environment: the project installed from its wheel, as a centre deploys it.

The stack's own venv (venv.py) is an editable install of the checkout, which
developers and the Slurm nodes run. This is a second, separate environment,
SITE_VENV, made from Debian's /usr/bin/python3 in a world-readable place the
nodes share, holding what a centre installs for JupyterHub and its single-user
servers:

- the project's wheel (`pip wheel --no-deps` of the checkout, the JupyterLab
  extension prebuilt inside it), non-editable;
- jupyterhub, batchspawner and wrapspawner at pinned versions (REQUIREMENTS).

Every wheel they need is first collected in a wheelhouse (SITE_WHEELHOUSE),
and the venv is installed from it with `pip install --no-index`: the install
itself needs no index and runs no npm (a wheel's install runs no build hook).
The project's wheel is cached by the content of the files it is built from
(WHEEL_SOURCES), so a repeated `dev/stack up` of an unchanged checkout neither
rebuilds it nor reinstalls the venv.
"""

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from . import layout
from .proc import run, say

SITE_VENV = layout.STATE / "site-venv"
SITE_WHEELHOUSE = layout.CACHE / "site-wheelhouse"
WHEELS = layout.CACHE / "site-wheels"  # one directory per content key, holding the project's wheel
PYTHON = SITE_VENV / "bin" / "python"
STAMP = SITE_VENV / ".jph-stamp"

# batchspawner 1.3.0 is the newest release on PyPI (March 2024) and the first whose
# batchspawner-singleuser reports the port through JUPYTERHUB_SERVICE_URL, which
# JupyterHub >= 2 single-user servers read; it declares no dependency on jupyterhub, so
# jupyterhub is pinned beside it to the release line the stack's tests run.
# wrapspawner 1.0.1 (its newest) gives ProfilesSpawner: the login-node and compute-node profiles.
REQUIREMENTS = ["jupyterhub>=5,<6", "batchspawner==1.3.0", "wrapspawner==1.0.1"]

# What the wheel is built from (pyproject.toml's wheel target, its hook and shared data).
WHEEL_SOURCES = [
    "pyproject.toml",
    "hatch_build.py",
    "README.md",
    "jupyter_podman_hpc",
    "kernels",
    "labextension",
    "jupyter-config",
]


def wheel_key() -> str:
    """A digest of the checkout's files that go into the wheel (tracked and new, as on disk)."""
    listed = subprocess.run(
        [
            "git",
            "-C",
            str(layout.CHECKOUT),
            "-c",
            f"safe.directory={layout.CHECKOUT}",
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
            "--",
            *WHEEL_SOURCES,
        ],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    digest = hashlib.sha256()
    for name in sorted(set(filter(None, listed))):
        path = layout.CHECKOUT / os.fsdecode(name)
        if path.is_file():  # a deleted tracked file is still listed until the deletion is staged
            digest.update(name + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def _wheel(key: str) -> Path | None:
    found = sorted((WHEELS / key).glob("jupyter_podman_hpc-*.whl"))
    return found[0] if found else None


def _wanted_stamp(key: str) -> str:
    return "\n".join([key, *REQUIREMENTS]) + "\n"


def installed() -> bool:
    """A wheel of the checkout and the pinned requirements are installed (of any content)."""
    try:
        _key, *requirements = STAMP.read_text().splitlines()
    except OSError:
        return False
    return requirements == REQUIREMENTS and PYTHON.exists()


def ready() -> bool:
    """Installed from a wheel of the checkout as it is now."""
    try:
        key = wheel_key()
    except (OSError, subprocess.CalledProcessError):
        return False
    return STAMP.exists() and STAMP.read_text() == _wanted_stamp(key) and _wheel(key) is not None


def _pip(*args: str) -> list[str]:
    return [str(PYTHON), "-m", "pip", "--disable-pip-version-check", *args]


def build_wheel(key: str) -> Path:
    """The project's wheel for this content key, built once."""
    cached = _wheel(key)
    if cached is not None:
        return cached
    say(f"building the project's wheel (content key {key}); cached in {WHEELS}")
    started = time.monotonic()
    partial = WHEELS / f".{key}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    run(_pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(partial), str(layout.CHECKOUT)), cwd=layout.CHECKOUT)
    # old keys go: only the current checkout's wheel is worth keeping
    for old in WHEELS.iterdir():
        if old != partial:
            shutil.rmtree(old, ignore_errors=True)
    os.replace(partial, WHEELS / key)
    say(f"built {_wheel(key).name} in {time.monotonic() - started:.1f} s")
    return _wheel(key)


def fill_wheelhouse(wheel: Path) -> None:
    """Every wheel the site environment needs, in SITE_WHEELHOUSE (the index is asked only here)."""
    SITE_WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    for old in SITE_WHEELHOUSE.glob("jupyter_podman_hpc-*.whl"):
        old.unlink()
    shutil.copy2(wheel, SITE_WHEELHOUSE / wheel.name)
    run(
        _pip(
            "wheel",
            "--quiet",
            "--wheel-dir",
            str(SITE_WHEELHOUSE),
            "--find-links",
            str(SITE_WHEELHOUSE),
            str(SITE_WHEELHOUSE / wheel.name),
            *REQUIREMENTS,
        )
    )


def _usable() -> bool:
    return (
        PYTHON.exists() and subprocess.run([str(PYTHON), "-m", "pip", "--version"], capture_output=True).returncode == 0
    )


def up() -> None:
    if ready():
        return
    started = time.monotonic()
    if not _usable():
        say(f"creating the site environment {SITE_VENV}")
        shutil.rmtree(SITE_VENV, ignore_errors=True)
        run(["/usr/bin/python3", "-m", "venv", str(SITE_VENV)])
    key = wheel_key()
    wheel = build_wheel(key)
    fill_wheelhouse(wheel)
    say(f"installing {wheel.name} and {', '.join(REQUIREMENTS)} into {SITE_VENV} from {SITE_WHEELHOUSE}")
    offline = ["--quiet", "--no-index", "--find-links", str(SITE_WHEELHOUSE)]
    run(_pip("install", *offline, str(SITE_WHEELHOUSE / wheel.name), *REQUIREMENTS))
    # the version does not change with every commit: replace the package itself
    run(_pip("install", *offline, "--force-reinstall", "--no-deps", str(SITE_WHEELHOUSE / wheel.name)))
    run(["chmod", "-R", "a+rX", str(SITE_VENV), str(SITE_WHEELHOUSE)])
    STAMP.write_text(_wanted_stamp(key))
    say(f"site environment ready in {time.monotonic() - started:.1f} s")


def status() -> dict[str, bool]:
    # Not ready(): the checkout changes under the engineers' hands, and an older wheel still
    # serves the tests until the next `up` rebuilds it.
    return {"site venv (wheel)": installed()}


def env() -> dict[str, str]:
    return {"STACK_SITE_VENV": str(SITE_VENV), "STACK_SITE_WHEELHOUSE": str(SITE_WHEELHOUSE)}
