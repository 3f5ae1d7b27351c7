"""podman-hpc-hook: the OCI prestart hook for modules' ``copy`` entries.

Registered through ``<hooks_dir>/02-hook_tool.json`` for containers with
the annotation ``podman_hpc.hook_tool=true`` (the annotation podman-hpc
uses). For each module whose ``env`` variable is set in the container, the
files of its ``copy`` rules are copied into the container's root file
system; if anything was copied into an image that has an ``ldconfig``, its
library cache is refreshed. Bind rules are not handled here: podman-hpc run
turns them into ``-v`` mounts before the container starts.

The image is not trusted, and the hook runs outside the container: as the
user, with every capability of podman's user namespace, the host's file
systems in view. So:

- copy destinations are resolved inside the root as the container will see
  them (``inroot``): a symlink in the image, absolute or climbing with
  ``..``, ends inside the root, and every write goes through descriptors of
  directories found that way, never through a path joined by text;
- the library cache is rebuilt by the *host's* ``ldconfig`` (statically
  linked, as glibc's is), executed from a descriptor opened on the host
  after a ``chroot`` into the container's root: the image's own
  ``/sbin/ldconfig`` (podman-hpc 1.2.2 runs it, so an image could run any
  program here) never runs, and what ldconfig writes stays in the root.
  A host whose ldconfig is dynamically linked gets no refreshed cache (its
  loader would be the image's), which the hook says on stderr.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import shutil
import stat
import struct
import sys
from pathlib import Path

from ..base import commands
from .config import SITE_DATA
from .inroot import DIRECTORY, make_dirs, open_in_root
from .modules import ModuleSet, resolve_binds

HOST_LDCONFIG = ("/sbin/ldconfig", "/usr/sbin/ldconfig")
PT_INTERP = 3
# Run in a child: chroot into the root, then execute the host's ldconfig from the descriptor
# opened before the chroot (fexecve): no path of the image is ever executed.
CONFINED_EXEC = """\
import os, sys
program = os.open(sys.argv[2], os.O_RDONLY)
os.chroot(sys.argv[1])
os.chdir("/")
os.execve(program, ["ldconfig"], {"LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
"""


class CopyError(Exception):
    """A copy rule cannot be carried out; the message names the target."""


def copy_into(root: Path, source: str, target: str) -> None:
    """Copy the host's ``source`` (a file, a symlink or a directory tree) to ``target``, a
    path as the container sees it, inside ``root``."""
    target = posixpath.normpath("/" + target)
    if target == "/":
        raise CopyError(f"copy target {target}: cannot replace the container's root")
    root_fd = os.open(root, DIRECTORY)
    try:
        if os.path.isdir(source) and not os.path.islink(source):
            _copy_tree(root_fd, source, target)
        else:
            _copy_entry(root_fd, source, target)
    except OSError as err:
        raise CopyError(f"cannot copy {source} to {target} in the container: {err.strerror or err}") from None
    finally:
        os.close(root_fd)


def _copy_tree(root_fd: int, source: str, target: str) -> None:
    """``cp -a source/. target/`` inside the root, merging with what is there."""
    os.close(make_dirs(root_fd, target, stat.S_IMODE(os.stat(source).st_mode)))
    for entry in sorted(os.scandir(source), key=lambda e: e.name):
        destination = posixpath.join(target, entry.name)
        if entry.is_dir(follow_symlinks=False):
            _copy_tree(root_fd, entry.path, destination)
        else:
            _copy_entry(root_fd, entry.path, destination)


def _copy_entry(root_fd: int, source: str, target: str) -> None:
    """One file or symlink: what is at ``target`` goes, the copy keeps mode and times."""
    parent, name = posixpath.split(target)
    dir_fd = make_dirs(root_fd, parent)
    try:
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            raise OSError(errno.EISDIR, f"{target} is a directory in the image") from None
        info = os.lstat(source)
        if stat.S_ISLNK(info.st_mode):
            os.symlink(os.readlink(source), name, dir_fd=dir_fd)
            return
        with open(source, "rb") as src:
            out = os.open(
                name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd
            )
            with open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
                os.fchmod(dst.fileno(), stat.S_IMODE(info.st_mode))
                os.utime(dst.fileno(), ns=(info.st_atime_ns, info.st_mtime_ns))
    finally:
        os.close(dir_fd)


def has_ldconfig(root: Path) -> bool:
    """Whether the image has an ``/sbin/ldconfig`` (a C library that keeps a cache)."""
    root_fd = os.open(root, DIRECTORY)
    try:
        os.close(open_in_root(root_fd, "/sbin/ldconfig", os.O_PATH))
        return True
    except OSError:
        return False
    finally:
        os.close(root_fd)


def is_static(program: str) -> bool:
    """Whether an ELF file has no program interpreter (a dynamic loader it needs)."""
    with open(program, "rb") as file:
        header = file.read(64)
        if header[:4] != b"\x7fELF":
            return False
        wide, order = header[4] == 2, "<" if header[5] == 1 else ">"
        if wide:
            (phoff,) = struct.unpack_from(order + "Q", header, 32)
            size, count = struct.unpack_from(order + "HH", header, 54)
        else:
            (phoff,) = struct.unpack_from(order + "I", header, 28)
            size, count = struct.unpack_from(order + "HH", header, 42)
        file.seek(phoff)
        table = file.read(size * count)
    return all(struct.unpack_from(order + "I", table, i * size)[0] != PT_INTERP for i in range(count))


def refresh_library_cache(root: Path) -> str:
    """Rebuild the root's ``/etc/ld.so.cache`` with the host's ldconfig, confined to the root;
    a line saying what was done."""
    program = next((path for path in HOST_LDCONFIG if os.path.isfile(path)), None)
    if program is None:
        return "library cache not refreshed: the host has no ldconfig"
    if not is_static(program):
        return f"library cache not refreshed: the host's {program} is not statically linked"
    result = commands.run(
        [sys.executable, "-I", "-c", CONFINED_EXEC, str(root), program],
        capture_output=True,
        text=True,
        env={},
        timeout=120,
    )
    if result.returncode != 0:
        detail = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
        return f"library cache not refreshed: ldconfig: {detail}"
    return f"library cache refreshed by the host's {program}"


def run_hook(state: dict, config: dict, hook_env: dict[str, str]) -> list[str]:
    """Apply the copies; returns a line per copied file."""
    root = Path(config["root"]["path"])
    if not root.is_absolute():
        root = Path(state.get("bundle", ".")) / root
    env = dict(hook_env)
    for item in config.get("process", {}).get("env", []):
        key, _, value = item.partition("=")
        env[key] = value
    modules = ModuleSet.load(env.get("PODMANHPC_MODULES_DIR") or str(SITE_DATA / "modules.d"))
    done: list[str] = []
    for module in modules:
        if module.env not in env or not module.copy:
            continue
        for source, target, _ in resolve_binds(module.copy, modules.directory, env):
            copy_into(root, source, target)
            done.append(f"{module.name}: copied {source} to {target}")
    if done and has_ldconfig(root):
        done.append(refresh_library_cache(root))
    return done


def main(argv: list[str] | None = None) -> int:
    """The hook's entry point: reads the OCI state from stdin and the bundle's config.json, runs the
    modules' copy rules; 0, or 1 with one ``podman-hpc-hook:`` line on stderr, which the runtime shows."""
    try:
        state = json.load(sys.stdin)
        bundle = Path(state.get("bundle") or os.getcwd())
        config = json.loads((bundle / "config.json").read_text())
        for line in run_hook(state, config, dict(os.environ)):
            print(line, file=sys.stderr)
    except Exception as err:  # noqa: BLE001  any failure is the one line the runtime shows, never a traceback
        print(f"podman-hpc-hook: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
