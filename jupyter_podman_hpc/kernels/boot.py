"""The kernel's first program inside the container: ipykernel, in-process.

The provisioner mounts this file into the container (read-only) and runs
it with the image's python instead of ``python3 -m ipykernel_launcher``.
It only needs the standard library and the image's ipykernel, never our
package (the image usually lacks it).

- ``python3 kernel_boot.py -f CONNECTION_FILE [ipykernel options]``: what
  ``ipykernel_launcher`` does, plus a guard on ``%load_ext
  jupyter_podman_hpc`` (one line saying what the image lacks instead of a
  traceback).
- ``python3 kernel_boot.py --pool``: a pooled kernel. It imports ipykernel
  and IPython first (the slow part of a start), says ``READY_LINE`` on
  stderr, then reads one JSON line on stdin naming the connection file and
  its contents, the working directory, the environment and the ipykernel
  arguments, and starts the kernel as above. So a pooled kernel gets a
  fresh connection file, keys and ports, cwd and variables, like a kernel
  started on demand.
"""

from __future__ import annotations

import json
import os
import sys

READY_LINE = "podman-hpc-kernel-pool: ready"
PRELOAD = ("ipykernel.kernelapp", "ipykernel.ipkernel", "ipykernel.zmqshell", "IPython.core.completer")
EXTENSION = "jupyter_podman_hpc"
INSTALL = "pip install jupyter-podman-hpc"


def preload() -> None:
    """Import what a kernel's start spends its time on (``PRELOAD``), so that a pooled kernel starts at
    once; a module the image lacks is left to the kernel's own import to report."""
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # the kernel's own import reports what is missing


def receive(stream) -> list[str]:
    """Apply one start request from ``stream``; returns the ipykernel arguments."""
    line = stream.readline()
    if not line:
        sys.exit(0)  # the pool let this kernel go unused
    request = json.loads(line)
    path = request["connection_file"]
    if not os.path.exists(path):  # its directory is not shared with the container: a private copy
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            json.dump(request["connection_info"], out)
    for name in request.get("unset", []):
        os.environ.pop(name, None)
    os.environ.update(request.get("env", {}))
    os.chdir(request["cwd"])
    return list(request["argv"])


def guard_load_ext(shell) -> None:
    """``%load_ext jupyter_podman_hpc`` in an image without it: one line, no traceback."""
    original = shell.find_line_magic("load_ext")  # the bound method (IPython 9 loads it lazily)
    if original is None:
        return

    def load_ext(line: str):
        name = line.strip()
        if name.split(".")[0] == EXTENSION:
            import importlib

            try:
                importlib.import_module(name)
            except ImportError as err:
                missing = getattr(err, "name", None) or name
                print(
                    f"%load_ext {name}: the image has no module named '{missing}': install "
                    f"jupyter-podman-hpc in the image ({INSTALL}) to use the podman-hpc magics in this kernel",
                    file=sys.stderr,
                )
                return None
        return original(line)

    load_ext.__doc__ = original.__doc__
    shell.register_magic_function(load_ext, "line", "load_ext")


PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")


def keep_connection_file(app_class) -> None:
    """Leave a connection file that already names every port as it is.

    ipykernel (6.17 in Debian bookworm) rewrites its connection file once its
    ports are bound: truncate, then write. That file is the host's (mounted at
    its path), and the moment the ports are bound is the moment the provisioner
    returns and jupyter_client reads the file again: it read an empty file
    (JSONDecodeError) now and then. The ports are the ones jupyter_client chose,
    so the kernel has nothing to add; newer ipykernels skip the write likewise.
    """
    original = app_class.write_connection_file

    def write_connection_file(self):
        try:
            with open(self.abs_connection_file) as file:
                info = json.load(file)
        except (OSError, ValueError):
            info = {}
        if isinstance(info, dict) and all(info.get(port) for port in PORTS):
            return
        original(self)

    app_class.write_connection_file = write_connection_file


def start(argv: list[str]) -> None:
    """Run ipykernel in this process as ``ipykernel_launcher`` would, with ipykernel options ``argv``, the
    connection file kept and ``%load_ext jupyter_podman_hpc`` guarded; returns when the kernel ends."""
    from ipykernel.kernelapp import IPKernelApp

    keep_connection_file(IPKernelApp)
    # as ipykernel_launcher: the kernel's cwd first on sys.path, not this file's directory
    sys.path[0] = os.getcwd()
    sys.argv = [sys.argv[0], *argv]
    app = IPKernelApp.instance()
    app.initialize(argv)
    if app.shell is not None:
        guard_load_ext(app.shell)
    app.start()


def main() -> None:
    """The boot program: start the kernel with the given options, or with ``--pool`` preload, say
    ``READY_LINE`` on stderr, and start it as the JSON line read on stdin says."""
    argv = sys.argv[1:]
    if argv[:1] == ["--pool"]:
        preload()
        print(READY_LINE, file=sys.stderr, flush=True)
        argv = receive(sys.stdin)
        sys.stdin = open(os.devnull)  # as a kernel started on demand
    start(argv)


if __name__ == "__main__":
    main()
