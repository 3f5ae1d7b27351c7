"""The host's Slurm inside a container: when the ``slurm`` site module applies, and its uid shim.

The module (``engine/site/data/modules.d/slurm.yaml``) mounts the host's Slurm
client commands, libraries, configuration and munge socket. A rootless
container runs as root inside, and slurmctld refuses a request whose uid
(0) is not the one munge vouches for (the user's); the shim, built here
once per user from ``engine/site/data/slurm/uid.c`` with the host's C compiler,
makes the commands send the user's host uid and gid. They are compiled in
(``-DPODMANHPC_HOST_UID=...``): a container cannot read them in every
user-namespace layout (with ``--userns=keep-id`` its uid map is relative to
podman's rootless namespace, not the host's), and compiled in they hold
in ``podman-hpc run --slurm`` as in a kernel, whatever a process's
environment. ``ModuleSet.podman_args`` builds it for any container that
gets the module (a kernel, ``podman-hpc run --slurm``) unless
``$PODMANHPC_SLURM_UID_SHIM`` names one. The user's name and home go in too: the shim answers the
user's passwd entry where the image has none (``squeue --me`` looks the uid
up). Without a compiler, the module still mounts the commands:
they then work only in containers that run as the user
(``--userns=keep-id``).

Every later kernel preloads the shim, so nobody else may change it: it is
kept in ``~/.cache/podman-hpc`` made or verified as the user's private
directory (``engine/base/private.py``), written 0500 under a temporary name and
renamed into place, used only while it is a regular file of the user's
that nobody else can write (else rebuilt), and mounted read-only.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pwd
import re
import shutil
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ... import stepsocket
from ..base import commands
from ..base.locks import flocked
from ..base.private import private_dir
from ..errors import EngineError

MODULE = "slurm"
SHIM_VARIABLE = "PODMANHPC_SLURM_UID_SHIM"  # what the module's bind rule mounts
SOURCE = Path(__file__).resolve().parent / "data" / "slurm" / "uid.c"
SHIM_MODE = 0o500
log = logging.getLogger(__name__)


# what may go into a C string literal of the shim as it is: a user name, a home directory
_PLAIN_NAME = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]*")
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9._/+@-]*")


@dataclass(frozen=True)
class HostIds:
    """The user's ids on the host, which the shim answers for getuid()/getgid() and their e- forms,
    and the user's name and home, its passwd entry where the image has none."""

    uid: int
    gid: int
    user: str = ""
    home: str = ""

    def defines(self) -> list[str]:
        """The compiler flags that build these ids into the shim; the name and home only when they are plain
        enough to quote in C."""
        flags = [f"-DPODMANHPC_HOST_UID={self.uid}", f"-DPODMANHPC_HOST_GID={self.gid}"]
        if _PLAIN_NAME.fullmatch(self.user) and _PLAIN_PATH.fullmatch(self.home):
            flags += [f'-DPODMANHPC_HOST_USER="{self.user}"', f'-DPODMANHPC_HOST_HOME="{self.home}"']
        return flags

    def flags_key(self) -> bytes:
        """What tells one user's (or group's) build from another's in the cache file's name."""
        return " ".join(self.defines()).encode()


def host_ids() -> HostIds:
    """This process's real ids: the user's on the host, where the provisioner and the CLI run."""
    uid = os.getuid()
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:  # no name for this uid here: ids only
        return HostIds(uid, os.getgid())
    return HostIds(uid, os.getgid(), entry.pw_name, entry.pw_dir)


def host_has_slurm(environ: Mapping[str, str]) -> bool:
    """Whether this node is a Slurm client: ``sbatch`` on the PATH and a configuration."""
    if shutil.which("sbatch", path=environ.get("PATH")) is None:
        return False
    conf = environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    return os.path.isfile(conf)


def cache_dir(environ: Mapping[str, str]) -> Path:
    """The user's cache directory (``~/.cache/podman-hpc``), where the built shim is kept; as the step
    socket defines it."""
    return Path(stepsocket.cache_dir(environ))  # the user's ~/.cache/podman-hpc, defined once


def uid_shim(environ: Mapping[str, str]) -> str | None:
    """The shim's path, built on first use; None when it cannot be built (logged)."""
    try:
        source = SOURCE.read_bytes()
    except OSError as err:
        log.warning("podman-hpc: no Slurm uid shim: cannot read %s: %s", SOURCE, err)
        return None
    directory = cache_dir(environ)
    ids = host_ids()
    target = directory / f"slurm-uid-{hashlib.sha256(source + ids.flags_key()).hexdigest()[:12]}.so"
    compiler = shutil.which("cc", path=environ.get("PATH")) or shutil.which("gcc", path=environ.get("PATH"))
    try:
        private_dir(directory)
        if is_own_file(target):
            return str(target)
        if compiler is None:
            log.warning(
                "podman-hpc: no C compiler to build the Slurm uid shim: Slurm commands in rootless "
                "container kernels will be refused (Invalid user id)"
            )
            return None
        with flocked(target.with_suffix(".lock"), 0o600):
            if not is_own_file(target):
                return build(compiler, target, ids)
    except (OSError, subprocess.SubprocessError, EngineError) as err:
        log.warning("podman-hpc: cannot build the Slurm uid shim in %s: %s", directory, err)
        return None
    return str(target)


def is_own_file(path: Path) -> bool:
    """Whether ``path`` is a regular file (not a link) of the user's that nobody else can write."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def build(compiler: str, target: Path, ids: HostIds) -> str | None:
    """Compile the shim for ``ids`` under a temporary name, make it 0500 and rename it over ``target``."""
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        argv = [compiler, "-shared", "-fPIC", "-O2", *ids.defines(), "-o", str(partial), str(SOURCE)]
        result = commands.run(argv, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            log.warning(
                "podman-hpc: building the Slurm uid shim failed: %s", (result.stderr.strip().splitlines() or ["?"])[-1]
            )
            return None
        os.chmod(partial, SHIM_MODE)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return str(target)
