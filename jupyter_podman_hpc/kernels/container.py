"""A container kernel's ``podman run`` command line: options, mounts, environment and boot program.

The provisioner (``provisioner.py``) holds a kernel's lifecycle; this module
says how one kernelspec's containers are run on this node, for a kernel
started on demand and for a pooled one (``pool.py``):

- ``--network host``: the kernel binds the ZeroMQ ports Jupyter chose, on
  the host's loopback;
- ``$HOME``, the kernel's working directory and the connection file (or its
  directory, for ipc) mounted at the same paths;
- ``--userns=keep-id`` where the image runs from its node-local layers
  (``keep_id: "auto"``, see ``KernelContainer.use_keep_id``);
- ``--init``, ``--pull never``, ``--rm``, the name and the labels;
- an argv of ``python -m ipykernel_launcher`` runs ``boot.py`` (mounted
  read-only) instead.
"""

from __future__ import annotations

import fnmatch
import os
import pwd
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..engine import EngineError
from ..engine.podman import Podman
from ..engine.store.graphroot import GraphRoot
from ..engine.store.squashed import SquashStore
from ..engine.text import truth

BOOT = Path(__file__).resolve().with_name("boot.py")  # mounted into the container, read-only
BOOT_IN_CONTAINER = "/opt/podman-hpc/kernel_boot.py"


class KernelStartError(EngineError):
    """A kernel could not start; ``str()`` is the message for the user (the
    server extension hands it to jupyter_server as an HTTP error)."""


@dataclass
class KernelContainer:
    """How the containers of one kernelspec run on this node."""

    podman: Podman
    image: str
    module_args: list[str]
    podman_args: list[str] = field(default_factory=list)
    spec_argv: list[str] = field(default_factory=list)
    spec_env: dict[str, str] = field(default_factory=dict)
    pass_env: list[str] = field(default_factory=list)
    init: bool = True
    keep_id: bool | str = "auto"

    def argv_in_image(self, cmd: Sequence[str]) -> list[str]:
        """The kernel command as the image must see it: KernelManager replaces a leading "python3"
        with the server's own interpreter, which inside the image must stay the image's python3."""
        argv = list(cmd)
        if argv and self.spec_argv and argv[0] == sys.executable and self.spec_argv[0] != sys.executable:
            argv[0] = self.spec_argv[0]
        return argv

    def boots(self, argv: Sequence[str]) -> bool:
        """Whether ``argv`` is ipykernel's launcher, which boot.py replaces (see boot.py)."""
        return len(argv) >= 3 and list(argv[1:3]) == ["-m", "ipykernel_launcher"] and mountable(str(BOOT))

    def use_keep_id(self) -> bool:
        """``--userns=keep-id``: as configured, or for ``auto`` where the image runs from local layers."""
        chosen = truth(self.keep_id)
        if chosen is not None:
            return chosen
        if str(self.keep_id).strip().lower() != "auto":
            raise KernelStartError(f"keep_id must be 'auto', 'true' or 'false', not {self.keep_id!r}")
        return self.runs_from_local_layers()

    def runs_from_local_layers(self) -> bool:
        """Whether the container's root will be the image's node-local layers: the graph root holds
        the image (podman then uses that copy) and the user's own store has no squashed copy of it
        (which the mount program reads instead, ``engine/mount/program.py``). From a squash file keep-id
        cannot work on hosts like ours: fuse-overlayfs with uid mapping over a squashfuse lower
        fails every copy-up ("creating /etc/mtab symlink", podman-hpc's issue #83)."""
        local = self.local_image_id()
        if not local:
            return False
        try:
            squashed = SquashStore(self.podman.config.squash_dir).images()
        except EngineError:  # no squashed store (no SCRATCH): the local layers
            return True
        return not any(image.id == local for image in squashed)

    def local_image_id(self) -> str:
        """The id of the image in the node-local graph root, or ''."""
        found = GraphRoot(self.podman.config.graph_root).find(self.image)
        return found["id"] if found else ""

    def mounts(self, cwd: str | None, connection_file: str = "", transport: str = "tcp") -> list[str]:
        """Host paths the kernel needs, each mounted at the same path."""
        wanted = [home()]
        connection_file = os.path.realpath(connection_file) if connection_file else ""
        if connection_file and transport == "ipc":
            wanted.append(os.path.dirname(connection_file))  # the sockets live beside it
        if cwd:
            wanted.append(os.path.realpath(cwd))
        chosen = outermost(wanted)
        args = volumes(chosen)
        if connection_file and not any(connection_file.startswith(c + "/") for c in chosen):
            # a tcp kernel needs just the file (often in /tmp: do not share all of it)
            args += volumes([connection_file])
        return args

    def environment(self, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """``--env NAME`` options and the podman process's environment that holds the values.

        Values stay out of podman's command line (a kernelspec's env may hold secrets).
        """
        names = {"HOME"} | set(self.spec_env)
        names |= {name for name in env if any(fnmatch.fnmatchcase(name, p) for p in self.pass_env)}
        names.discard("JPY_PARENT_PID")  # ipykernel would watch a pid of another namespace
        names.discard("JPY_API_TOKEN")  # JupyterHub's token for the server, not for images
        podman_env = dict(self.podman.env)
        for name in names:
            if name in env:
                podman_env[name] = env[name]
        podman_env.setdefault("HOME", home())
        args: list[str] = []
        for name in sorted(names):
            if name in podman_env:
                args += ["--env", name]
        return args, podman_env

    def run_options(self, name: str, labels: dict[str, str]) -> list[str]:
        """The ``podman run`` options every kernel container of this kernelspec gets."""
        options = ["--rm", "--replace", "--name", name, "--pull", "never"]
        if self.init:
            options.append("--init")
        for key, value in labels.items():
            options += ["--label", f"{key}={value}"]
        named = networks([*self.podman.run_defaults(), *self.module_args, *self.podman_args])
        if any(n != "host" for n in named):
            raise KernelStartError(
                f"a kernel needs the host network (its ZeroMQ ports), but --network "
                f"{next(n for n in named if n != 'host')} is set by the site "
                "configuration, a module or podman_args"
            )
        if not named:
            options += ["--network", "host"]
        if self.use_keep_id():
            options += ["--userns", "keep-id"]
        return options

    def kernel_command(
        self,
        name: str,
        labels: dict[str, str],
        cmd: Sequence[str],
        env: dict[str, str],
        cwd: str | None,
        connection_file: str = "",
        transport: str = "tcp",
    ) -> tuple[list[str], dict[str, str]]:
        """``podman run`` of a kernel started on demand, and podman's environment."""
        options = self.run_options(name, labels) + self.mounts(cwd, connection_file, transport)
        workdir = os.path.realpath(cwd) if cwd and os.path.isdir(cwd) else home()
        env_args, podman_env = self.environment(env)
        options += ["--workdir", workdir, *env_args]
        kernel_argv = self.argv_in_image(cmd)
        if self.boots(kernel_argv):
            options += volumes([str(BOOT)], BOOT_IN_CONTAINER)
            kernel_argv = [kernel_argv[0], BOOT_IN_CONTAINER, *kernel_argv[3:]]
        return self.podman.run_command(
            [*options, *self.podman_args, self.image, *kernel_argv], self.module_args
        ), podman_env

    def pool_command(
        self, name: str, labels: dict[str, str], env: dict[str, str], dirs: Sequence[str]
    ) -> tuple[list[str], dict[str, str]]:
        """``podman run`` of a pooled container: boot.py waiting for its kernel (see pool.py)."""
        options = self.run_options(name, labels)
        options += ["--interactive", *volumes(outermost([home(), *dirs])), "--workdir", home()]
        env_args, podman_env = self.environment(env)
        options += env_args + volumes([str(BOOT)], BOOT_IN_CONTAINER)
        python = self.argv_in_image(self.spec_argv)[0]
        return self.podman.run_command(
            [*options, *self.podman_args, self.image, python, BOOT_IN_CONTAINER, "--pool"], self.module_args
        ), podman_env


def mountable(path: str) -> bool:
    """``path`` can be given to podman's ``--volume`` as it is (no ``:`` or ``,``, which its syntax would
    split at)."""
    return ":" not in path and "," not in path


def outermost(paths: Sequence[str]) -> list[str]:
    """The existing directories among ``paths`` that are not inside another one (never "/")."""
    chosen: list[str] = []
    for path in sorted({os.path.normpath(p) for p in paths if p and os.path.isdir(p)}, key=len):
        if path != "/" and not any(path == c or path.startswith(c + "/") for c in chosen):
            chosen.append(path)
    return chosen


def volumes(paths: Sequence[str], target: str | None = None) -> list[str]:
    """``--volume`` options mounting each path at the same path (or at ``target``, read-only)."""
    args: list[str] = []
    for path in paths:
        if not mountable(path):
            raise KernelStartError(
                f"cannot mount {path} into the kernel container: ':' and ',' are not allowed in its path"
            )
        args += ["--volume", f"{path}:{target}:ro" if target else f"{path}:{path}"]
    return args


def home() -> str:
    """The user's home directory: ``$HOME``, else the passwd entry's, else ``/``."""
    found = os.environ.get("HOME")
    if found:
        return found
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return "/"


def networks(args: Sequence[str]) -> list[str]:
    """The values of --network/--net options in a podman run argument list."""
    found = []
    for i, arg in enumerate(args):
        name, has_value, value = arg.partition("=")
        if name in ("--network", "--net"):
            if not has_value:
                value = args[i + 1] if i + 1 < len(args) else ""
            found.append(value)
    return found
