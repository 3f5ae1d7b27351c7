"""podman-hpc-hook: the OCI prestart hook for modules' ``copy`` entries.

Registered through ``<hooks_dir>/02-hook_tool.json`` for containers with
the annotation ``podman_hpc.hook_tool=true`` (the annotation podman-hpc
uses). For each module whose ``env`` variable is set in the container, the
files of its ``copy`` rules are copied into the container's root file
system; if anything was copied, the container's ``ldconfig`` refreshes its
library cache. Bind rules are not handled here: podman-hpc run turns them
into ``-v`` mounts before the container starts.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from . import commands
from .config import SITE_DATA
from .modules import ModuleSet, resolve_binds


def copy_into(root: Path, source: str, target: str) -> None:
    destination = Path(os.path.normpath(f"{root}/{target}"))
    if root not in destination.parents:
        raise ValueError(f"copy target {target} leaves the container")
    destination.parent.mkdir(parents=True, exist_ok=True)
    if os.path.isdir(source) and not os.path.islink(source):
        shutil.copytree(source, destination, symlinks=True, dirs_exist_ok=True)
    else:
        if destination.is_symlink() or destination.exists():
            destination.unlink()
        shutil.copy2(source, destination, follow_symlinks=False)


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
        for source, target in resolve_binds(module.copy, modules.directory, env):
            copy_into(root, source, target)
            done.append(f"{module.name}: copied {source} to {target}")
    if done:
        ldconfig = root / "sbin" / "ldconfig"
        if ldconfig.exists():
            commands.run(["chroot", str(root), "/sbin/ldconfig"], capture_output=True)
    return done


def main(argv: list[str] | None = None) -> int:
    try:
        state = json.load(sys.stdin)
        bundle = Path(state.get("bundle") or os.getcwd())
        config = json.loads((bundle / "config.json").read_text())
        for line in run_hook(state, config, dict(os.environ)):
            print(line, file=sys.stderr)
    except Exception as err:  # the runtime shows this text when the hook fails
        print(f"podman-hpc-hook: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
