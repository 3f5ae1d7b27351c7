"""A kernel site for container kernels on the real stack: this test process and its subprocesses
pointed at a squashed store, with throwaway Jupyter directories (``KernelSite``, ``site_over``).

The provisioner reads the engine's settings from the environment of the process that starts
kernels, hence ``use_env`` on this process's environment.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from jupyter_podman_hpc.kernels import kernelspec
from jupyter_podman_hpc.kernels.orphans import LABEL
from tests.helpers.hpc import Hpc

ENGINE_VARS = ("PODMANHPC_GRAPH_ROOT", "PODMANHPC_RUN_ROOT", "PODMANHPC_CONFIG_HOME", "SQUASH_DIR")
BIN = Path(sys.executable).parent


@dataclass
class KernelSite:
    hpc: Hpc
    root: Path
    env: dict[str, str]

    @property
    def prefix(self) -> Path:
        return self.root / "prefix"

    def install(self, image: str, name: str, **kwargs) -> kernelspec.ContainerKernel:
        return kernelspec.install(image, name=name, prefix=self.prefix, **kwargs)

    def set_config(self, name: str, **config) -> None:
        """Change a kernelspec's provisioner config (keys the CLI does not offer)."""
        path = self.prefix / "share" / "jupyter" / "kernels" / name / "kernel.json"
        spec = json.loads(path.read_text())
        spec["metadata"]["kernel_provisioner"]["config"].update(config)
        path.write_text(json.dumps(spec))

    def containers(self, kernel_id: str | None = None) -> list[dict]:
        """Kernel containers in the test storage (all states), optionally of one kernel."""
        label = f"{LABEL}={kernel_id}" if kernel_id else LABEL
        out = self.hpc("ps", "--all", "--filter", f"label={label}", "--format", "json").stdout
        return json.loads(out or "[]") or []

    def container_names(self, kernel_id: str | None = None) -> list[str]:
        return [c["Names"][0] for c in self.containers(kernel_id)]

    def wait_gone(self, name: str, timeout: float) -> float:
        """Seconds until the container ``name`` no longer exists (fails after ``timeout``)."""
        started = time.monotonic()
        while name in self.container_names():
            if time.monotonic() - started > timeout:
                pytest.fail(f"container {name} still exists after {timeout} s: {self.containers()}")
            time.sleep(0.2)
        return time.monotonic() - started


def site_env(hpc: Hpc, root: Path) -> dict[str, str]:
    env = dict(hpc.env)
    env.update(
        {
            "JUPYTER_PATH": str(root / "prefix" / "share" / "jupyter"),
            "JUPYTER_DATA_DIR": str(root / "data"),
            "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
            "JUPYTER_CONFIG_DIR": str(root / "config"),
            "JUPYTER_PLATFORM_DIRS": "0",
            "PATH": f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}",
        }
    )
    return env


def use_env(monkeypatch, env: dict[str, str]) -> None:
    for name in (
        *ENGINE_VARS,
        "JUPYTER_PATH",
        "JUPYTER_DATA_DIR",
        "JUPYTER_RUNTIME_DIR",
        "JUPYTER_CONFIG_DIR",
        "JUPYTER_PLATFORM_DIRS",
    ):
        monkeypatch.setenv(name, env[name])


def remove_kernel_containers(hpc: Hpc) -> None:
    """Containers a failed test left behind (the storage is the tests' own)."""
    out = hpc("ps", "--all", "--filter", f"label={LABEL}", "--format", "{{.Names}}", check=False).stdout
    names = out.split()
    if names:
        hpc("rm", "--force", "--time", "0", *names, check=False)


def site_over(hpc: Hpc, root: Path, monkeypatch) -> Iterator[KernelSite]:
    """A kernel site on ``hpc``'s squashed store, in this process's environment; then the
    kernel containers a failed test left behind are removed."""
    env = site_env(hpc, root)
    use_env(monkeypatch, env)
    yield KernelSite(hpc, root, env)
    remove_kernel_containers(hpc)
