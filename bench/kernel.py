"""Kernel start: time from launch to the first kernel_info reply, container kernel vs local ipykernel.

Configurations, each a kernelspec in a throwaway ``JUPYTER_PATH``:

- ``local ipykernel``: the project's virtual environment's
  ``python -m ipykernel_launcher`` (what a notebook server starts by default);
- ``container kernel``: the base image's ipykernel through the podman-hpc
  kernel provisioner (a kernelspec written by
  ``jupyter_podman_hpc.kernels.kernelspec.install``), the image run from the
  squashed store by a node-local storage that has never seen it, as on a
  compute node.

One measurement: ``KernelManager.start_kernel()``, then a client sends
``kernel_info_request`` until the first ``kernel_info_reply`` arrives (as
``wait_for_ready`` does, without its IOPub flush); the clock stops at the
reply. Shutting the kernel down is not timed. The measurements run in a child
process (``kernel.py --child``) with the engine's and Jupyter's variables
set; it starts one kernel of each kind first (not recorded: imports, the
provisioner's one-off sweep of orphaned containers, the page cache), then
alternates the two.
"""

from __future__ import annotations

import argparse
import json
import queue
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

from common import Failure, PrivateStorage, Sample, alternating, ensure_pulled, pulled_store, store_env

BENCHMARK = "kernel"
CONFIGS = ["local ipykernel", "container kernel"]
KERNEL_NAMES = {"local ipykernel": "bench-local", "container kernel": "bench-container"}
READY_TIMEOUT = 180.0


def measure(image: str, work: Path, repetitions: int, failures: list[Failure],
            log: Callable[[str], None] = print) -> list[Sample]:
    ensure_pulled(image, log)
    root = work / "kernel"
    root.mkdir(parents=True, exist_ok=True)
    storage = PrivateStorage(f"kernel-{uuid.uuid4().hex[:8]}")  # a "compute node" that never pulled
    env = {
        **storage.env(store_env(pulled_store())),
        "JUPYTER_PATH": str(root / "prefix" / "share" / "jupyter"),
        "JUPYTER_DATA_DIR": str(root / "data"),
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
        "JUPYTER_CONFIG_DIR": str(root / "config"),
        "JUPYTER_PLATFORM_DIRS": "0",
    }
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", "--image", image, "--prefix",
            str(root / "prefix"), "--repetitions", str(repetitions)]
    samples: list[Sample] = []
    try:
        process = subprocess.Popen(argv, env=env, cwd=str(root.parent), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        assert process.stdout is not None
        for line in process.stdout:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "error" in record:
                failures.append(Failure(BENCHMARK, record["config"], "start", record["repetition"], record["error"]))
                log(f"kernel {record['config']:<18} rep {record['repetition']}: FAILED {record['error']}")
                continue
            samples.append(Sample(BENCHMARK, record["config"], "start", record["repetition"], "ready_seconds",
                                  record["seconds"]))
            log(f"kernel {record['config']:<18} rep {record['repetition']}: {record['seconds']:.2f} s")
        stderr = process.stderr.read() if process.stderr else ""
        if process.wait() != 0:
            tail = " | ".join(stderr.strip().splitlines()[-3:])
            failures.append(Failure(BENCHMARK, "-", "start", -1, f"the measuring process exited "
                                                                  f"{process.returncode}: {tail}"))
    finally:
        storage.remove(nodes=False)
    return samples


# --- the child: starts the kernels ---------------------------------------------------------


def _install(image: str, prefix: Path) -> None:
    from jupyter_podman_hpc.kernels import kernelspec

    kernelspec.install(image, name=KERNEL_NAMES["container kernel"], prefix=prefix,
                       display_name=f"bench: {image}")
    local = kernelspec.kernels_dir(prefix=prefix) / KERNEL_NAMES["local ipykernel"]
    local.mkdir(parents=True, exist_ok=True)
    (local / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "bench: local ipykernel", "language": "python", "interrupt_mode": "message",
        "env": {"PYDEVD_DISABLE_FILE_VALIDATION": "1"}}))


def _start(name: str) -> float:
    """Seconds from launching kernel ``name`` to its first kernel_info reply; the kernel is shut down."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    started = time.perf_counter()
    manager = KernelManager(kernel_name=name, kernel_spec_manager=KernelSpecManager())
    manager.start_kernel()
    client = manager.client()
    try:
        client.start_channels()
        sent: set[str] = set()
        deadline = started + READY_TIMEOUT
        while True:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"no kernel_info reply within {READY_TIMEOUT:.0f} s")
            if not manager.is_alive():
                raise RuntimeError("the kernel died before replying")
            sent.add(client.kernel_info())  # queued by ZeroMQ until the kernel's socket is there
            try:
                reply = client.get_shell_msg(timeout=1.0)
            except queue.Empty:
                continue
            if reply["msg_type"] == "kernel_info_reply" and reply["parent_header"].get("msg_id") in sent:
                return time.perf_counter() - started
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)


def child(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--image", required=True)
    parser.add_argument("--prefix", type=Path, required=True)
    parser.add_argument("--repetitions", type=int, default=5)
    args = parser.parse_args(argv)
    _install(args.image, args.prefix)
    for config in CONFIGS:  # warm-up, not recorded
        try:
            _start(KERNEL_NAMES[config])
        except Exception as err:  # the timed runs report it
            print(f"warm-up of {config} failed: {err}", file=sys.stderr)
    for repetition in range(args.repetitions):
        for config in alternating(CONFIGS, repetition):
            try:
                record = {"config": config, "repetition": repetition, "seconds": _start(KERNEL_NAMES[config])}
            except Exception as err:
                record = {"config": config, "repetition": repetition, "error": f"{type(err).__name__}: {err}"}
            print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(child(sys.argv[1:]))
