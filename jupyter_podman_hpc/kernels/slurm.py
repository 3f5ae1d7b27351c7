"""Slurm inside container kernels: when the ``slurm`` site module applies, and its uid shim.

The module (``engine/site/modules.d/slurm.yaml``) mounts the host's Slurm
client commands, libraries, configuration and munge socket. A rootless
container runs as root inside, and slurmctld refuses a request whose uid
(0) is not the one munge vouches for (the user's); the shim, built here
once per user and source from ``engine/site/slurm/uid.c`` with the host's
C compiler, makes the commands send the user's host uid. Without a
compiler, the module still mounts the commands: they then work only in
containers that run as the user (``--userns=keep-id``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Mapping

from ..engine import commands
from ..engine.locks import flocked

MODULE = "slurm"
SHIM_VARIABLE = "PODMANHPC_SLURM_UID_SHIM"  # what the module's bind rule mounts
SOURCE = Path(__file__).resolve().parents[1] / "engine" / "site" / "slurm" / "uid.c"
log = logging.getLogger(__name__)


def host_has_slurm(environ: Mapping[str, str]) -> bool:
    """Whether this node is a Slurm client: ``sbatch`` on the PATH and a configuration."""
    if shutil.which("sbatch", path=environ.get("PATH")) is None:
        return False
    conf = environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    return os.path.isfile(conf)


def cache_dir(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".cache")
    return Path(base) / "podman-hpc"


def uid_shim(environ: Mapping[str, str]) -> str | None:
    """The shim's path, built on first use; None when it cannot be built (logged)."""
    try:
        source = SOURCE.read_bytes()
    except OSError as err:
        log.warning("podman-hpc: no Slurm uid shim: cannot read %s: %s", SOURCE, err)
        return None
    target = cache_dir(environ) / f"slurm-uid-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if target.is_file():
        return str(target)
    compiler = shutil.which("cc", path=environ.get("PATH")) or shutil.which("gcc", path=environ.get("PATH"))
    if compiler is None:
        log.warning("podman-hpc: no C compiler to build the Slurm uid shim: Slurm commands in rootless "
                    "container kernels will be refused (Invalid user id)")
        return None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with flocked(target.with_suffix(".lock")):
            if not target.is_file():
                partial = target.with_name(f".{target.name}.{os.getpid()}")
                argv = [compiler, "-shared", "-fPIC", "-O2", "-o", str(partial), str(SOURCE)]
                result = commands.run(argv, capture_output=True, text=True, timeout=120)
                if result.returncode != 0:
                    partial.unlink(missing_ok=True)
                    log.warning("podman-hpc: building the Slurm uid shim failed: %s",
                                (result.stderr.strip().splitlines() or ["?"])[-1])
                    return None
                os.replace(partial, target)
    except (OSError, subprocess.SubprocessError) as err:
        log.warning("podman-hpc: cannot build the Slurm uid shim in %s: %s", target.parent, err)
        return None
    return str(target)
