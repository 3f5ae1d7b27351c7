"""Kernel start: time from launch to the first kernel_info reply, container kernels vs a local ipykernel.

Configurations, each a kernelspec in a throwaway ``JUPYTER_PATH``:

- ``local ipykernel``: the project's virtual environment's
  ``python -m ipykernel_launcher`` (what a notebook server starts by default);
- ``container kernel``: the base image's ipykernel through the podman-hpc
  kernel provisioner (a kernelspec written by
  ``jupyter_podman_hpc.kernels.kernelspec.install``), the image run from the
  squashed store by a node-local storage that has never seen it, as on a
  compute node;
- ``pooled container kernel``: the same with ``pool: 1`` (a warm pool): a
  start adopts a started container. The time the pool takes to refill between
  two starts is not counted (each pooled start waits for a ready pool first);
- ``container kernel, server just started``: a kernelspec installed with no
  pool size, as a user does (the server's default pool, ``c.PodmanHPC.kernel_pool``,
  one), started as soon as a new server answers: the server's pool container
  is still starting when the kernel adopts it. A new server for each sample:
  a user's first kernel, at its worst;
- ``container kernel, server started 2 s before``: the same, started 2 s after
  the new server answered, as when a user first loads JupyterLab's page and
  then clicks;
- ``container kernel, login node after a pull``: the same kernelspec, started
  by a second server whose node-local storage has pulled the image
  (``podman-hpc pull``: the image is local AND squashed, as on a login node
  after a pull). On the login node (no Slurm job) ``auto`` does not unpack,
  and the mount program keeps the local layers (fuse-overlayfs), which read
  as fast as squashfuse; in a job it reads the unpacked squashed copy
  (``engine/mount/program.py``). Its server runs after the first one, in the same
  benchmark run.

The cold configurations' kernelspecs have ``pool: 0``: the server's default
pool would otherwise serve them.

Two paths (the table's rows):

- ``KernelManager``: ``KernelManager.start_kernel()``, then a client sends
  ``kernel_info_request`` until the first ``kernel_info_reply`` arrives (as
  ``wait_for_ready`` does, without its IOPub flush);
- ``server``: a real ``jupyter server``: ``POST /api/kernels``, then
  ``kernel_info_request`` on the kernel's WebSocket until the reply (what
  JupyterLab waits for).

The clock stops at the reply; shutting the kernel down is not timed. The
measurements run in child processes (``kernel.py --child``) with the engine's
and Jupyter's variables set, the cold container kernel and the pooled one in
separate children (a pool's ready container would keep the image's squashfuse
mount warm for the cold starts), each against the local ipykernel; a child
starts one kernel of each kind first (not recorded: imports, the provisioner's
one-off sweep of orphaned containers, the page cache), then alternates the
configurations. After the server stops, the kernel and pool containers still
there are counted: any is a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import functools
import json
import os
import queue
import secrets
import shutil
import socket
import subprocess
import sys
import time
import traceback
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

from common import Failure, PrivateStorage, Sample, alternating, ensure_pulled, pulled_store, store_env, timed

BENCHMARK = "kernel"
CONFIGS = ["local ipykernel", "container kernel", "pooled container kernel"]
POOLED = "pooled container kernel"
LOGIN = "container kernel, login node after a pull"
FRESH = "container kernel, server just started"
LATER = "container kernel, server started 2 s before"
FIRST_KERNEL_DELAYS = {FRESH: 0.0, LATER: 2.0}  # seconds from a new server's first answer to its first kernel
KERNEL_NAMES = {
    "local ipykernel": "bench-local",
    "container kernel": "bench-container",
    POOLED: "bench-pooled",
    LOGIN: "bench-container",
    FRESH: "bench-default",
    LATER: "bench-default",
}
POOL_SETTLE = 4.0  # seconds a server's pool container gets to become ready (not visible from outside)
READY_TIMEOUT = 180.0


def measure(
    image: str, work: Path, repetitions: int, failures: list[Failure], log: Callable[[str], None] = print
) -> list[Sample]:
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
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--image",
        image,
        "--prefix",
        str(root / "prefix"),
        "--repetitions",
        str(repetitions),
    ]
    samples: list[Sample] = []
    try:
        # cold and pooled in separate servers: a pool's ready container keeps the image's squashfuse
        # mount (and its page cache) alive, and a cold start beside it would read through a warm mount
        for configs in (
            ["local ipykernel", "container kernel"],
            ["local ipykernel", POOLED],
            ["local ipykernel", FRESH, LATER],
        ):
            samples += _run_child([*argv, "--configs", *configs], env, root, failures, log)
    finally:
        storage.remove(nodes=False)
    # the login node after a pull: the image in this storage too (podman-hpc pull: local and squashed)
    storage = PrivateStorage(f"kernel-pulled-{uuid.uuid4().hex[:8]}")
    try:
        timed(["podman-hpc", "pull", image], storage.env(store_env(pulled_store())), timeout=1800)
        samples += _run_child(
            [*argv, "--configs", "local ipykernel", LOGIN],
            {**env, **storage.env(store_env(pulled_store()))},
            root,
            failures,
            log,
        )
    finally:
        storage.remove(nodes=False)
    return samples


def _run_child(
    argv: list[str], env: dict[str, str], root: Path, failures: list[Failure], log: Callable[[str], None]
) -> list[Sample]:
    """The samples of one measuring process (``kernel.py --child``); its failures into ``failures``."""
    samples: list[Sample] = []
    process = subprocess.Popen(
        argv, env=env, cwd=str(root.parent), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    for line in process.stdout:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        where = f"kernel {record['size']:<13} {record['config']:<41} rep {record['repetition']}"
        if "error" in record:
            failures.append(Failure(BENCHMARK, record["config"], record["size"], record["repetition"], record["error"]))
            log(f"{where}: FAILED {record['error']}")
            continue
        if record["metric"] == "containers_left":  # a check, not a time: 0 or a failure
            log(f"kernel containers left after the server stopped: {record['value']:.0f}")
            if record["value"]:
                failures.append(
                    Failure(
                        BENCHMARK,
                        record["config"],
                        record["size"],
                        0,
                        f"{record['value']:.0f} kernel containers left after the server stopped",
                    )
                )
            continue
        samples.append(
            Sample(BENCHMARK, record["config"], record["size"], record["repetition"], record["metric"], record["value"])
        )
        log(f"{where}: {record['metric']} {record['value']:.2f}")
    stderr = process.stderr.read() if process.stderr else ""
    if process.wait() != 0:
        tail = " | ".join(stderr.strip().splitlines()[-3:])
        failures.append(
            Failure(BENCHMARK, "-", "start", -1, f"the measuring process exited {process.returncode}: {tail}")
        )
    return samples


# --- the child: starts the kernels ---------------------------------------------------------


def _install(image: str, prefix: Path, configs: list[str]) -> None:
    """The kernelspecs of ``configs`` only (a pool's kernelspec starts its pool with the server)."""
    from jupyter_podman_hpc.kernels import kernelspec

    for path in kernelspec.kernels_dir(prefix=prefix).glob("bench-*"):
        shutil.rmtree(path)
    if {"container kernel", LOGIN} & set(configs):
        kernelspec.install(
            image, name=KERNEL_NAMES["container kernel"], prefix=prefix, display_name=f"bench: {image}", pool=0
        )
    if {FRESH, LATER} & set(configs):
        kernelspec.install(image, name=KERNEL_NAMES[FRESH], prefix=prefix, display_name=f"bench: {image} (default)")
    if POOLED in configs:
        kernelspec.install(
            image, name=KERNEL_NAMES[POOLED], prefix=prefix, display_name=f"bench: {image} (pool)", pool=1
        )
    local = kernelspec.kernels_dir(prefix=prefix) / KERNEL_NAMES["local ipykernel"]
    local.mkdir(parents=True, exist_ok=True)
    (local / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "bench: local ipykernel",
                "language": "python",
                "interrupt_mode": "message",
                "env": {"PYDEVD_DISABLE_FILE_VALIDATION": "1"},
            }
        )
    )


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


def _emit(config: str, size: str, repetition: int, metric: str, measure: Callable[[], float]) -> None:
    try:
        record = {"value": measure()}
    except Exception as err:  # noqa: BLE001  any failure of a measurement is recorded as its result
        # a failure says where it came from: the innermost frames outside the standard library
        frames = [
            f
            for f in traceback.extract_tb(err.__traceback__)
            if "/lib/python3" not in f.filename or "site-packages" in f.filename
        ][-3:]
        where = " < ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames))
        record = {"error": f"{type(err).__name__}: {err} (at {where})"}
    record.update(config=config, size=size, repetition=repetition, metric=metric)
    print(json.dumps(record), flush=True)


def _manager_path(repetitions: int, configs: list[str]) -> None:
    from jupyter_podman_hpc.kernels import pool

    def start(config: str) -> float:
        if config == POOLED:
            pool.wait_all_ready(120)
        return _start(KERNEL_NAMES[config])

    for config in configs:  # warm-up, not recorded; the pooled one makes its pool
        try:
            start(config)
        except Exception as err:  # noqa: BLE001  any failure: the timed runs report it
            print(f"warm-up of {config} failed: {err}", file=sys.stderr)
    for repetition in range(repetitions):
        for config in alternating(configs, repetition):
            _emit(config, "KernelManager", repetition, "ready_seconds", functools.partial(start, config))
    pool.close_all()


# --- through a real jupyter server ----------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _request(method: str, url: str, token: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Authorization": f"token {token}", "Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=READY_TIMEOUT) as answer:
        text = answer.read()
    return json.loads(text) if text else {}


async def _info_on_websocket(url: str, token: str) -> None:
    """Send kernel_info_request on the kernel's WebSocket until a reply comes."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    connection = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {token}"}))
    try:
        sent: set[str] = set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_TIMEOUT
        while loop.time() < deadline:
            msg_id = uuid.uuid4().hex
            sent.add(msg_id)
            connection.write_message(
                json.dumps(
                    {
                        "header": {
                            "msg_id": msg_id,
                            "username": "bench",
                            "session": uuid.uuid4().hex,
                            "msg_type": "kernel_info_request",
                            "version": "5.3",
                            "date": datetime.datetime.now(datetime.UTC).isoformat(),
                        },
                        "parent_header": {},
                        "metadata": {},
                        "content": {},
                        "channel": "shell",
                        "buffers": [],
                    }
                )
            )
            try:
                while True:
                    raw = await asyncio.wait_for(connection.read_message(), 1.0)
                    if raw is None:
                        raise ConnectionError("the kernel's WebSocket closed")
                    msg = json.loads(raw)
                    if msg["header"]["msg_type"] == "kernel_info_reply" and msg["parent_header"].get("msg_id") in sent:
                        return
            except TimeoutError:
                continue
        raise TimeoutError(f"no kernel_info reply on the WebSocket within {READY_TIMEOUT:.0f} s")
    finally:
        connection.close()


def _kernel_containers() -> int:
    from jupyter_podman_hpc.engine.podman import Podman
    from jupyter_podman_hpc.engine.site.config import load_config
    from jupyter_podman_hpc.kernels.orphans import kernel_containers

    return len(kernel_containers(Podman(load_config(os.environ), os.environ)))


def _pool_started(timeout: float) -> None:
    """Until the server's pool has a container, then the settle time (readiness is not visible)."""
    from jupyter_podman_hpc.engine.podman import Podman
    from jupyter_podman_hpc.engine.site.config import load_config
    from jupyter_podman_hpc.kernels.orphans import POOL_LABEL, kernel_containers

    podman = Podman(load_config(os.environ), os.environ)
    deadline = time.monotonic() + timeout
    while not any((c.get("Labels") or {}).get(POOL_LABEL) for c in kernel_containers(podman)):
        if time.monotonic() > deadline:
            raise TimeoutError("the server started no pool container")
        time.sleep(0.2)
    time.sleep(POOL_SETTLE)


@contextlib.contextmanager
def _server(root: Path, *args: str):
    """A running ``jupyter server`` (with ``args``) rooted at ``root``: (base URL, token); stopped after."""
    port, token = _free_port(), secrets.token_hex(16)
    root.mkdir(parents=True, exist_ok=True)
    log = open(root.parent / "server.log", "ab")
    server = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("jupyter-server")),
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            "--ServerApp.open_browser=False",
            f"--ServerApp.root_dir={root}",
            *args,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                _request("GET", f"{base}/api/status", token)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"jupyter server did not start (see {root.parent / 'server.log'})")
                time.sleep(0.05)
        yield base, token
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def _ready_seconds(base: str, token: str, name: str) -> float:
    """POST /api/kernels for kernelspec ``name`` to the first kernel_info reply on its WebSocket; the kernel
    is deleted after (not timed)."""
    started = time.perf_counter()
    kernel = _request("POST", f"{base}/api/kernels", token, {"name": name})
    try:
        asyncio.run(_info_on_websocket(f"ws{base[4:]}/api/kernels/{kernel['id']}/channels", token))
        return time.perf_counter() - started
    finally:
        _request("DELETE", f"{base}/api/kernels/{kernel['id']}", token)


def _first_kernel_ready_seconds(root: Path, delay: float) -> float:
    """A user's first kernel: a new server (default settings), and ``delay`` s after it answers a kernel of
    the kernelspec without a pool size, which adopts the pool container the server started (or is starting)."""
    with _server(root) as (base, token):
        time.sleep(delay)
        return _ready_seconds(base, token, KERNEL_NAMES[FRESH])


def _server_path(repetitions: int, root: Path, configs: list[str]) -> None:
    # no default pool in this server: its container would keep the image's squashfuse mount warm for the
    # cold starts and for the first kernels' servers
    with _server(root, "--PodmanHPC.kernel_pool=0") as (base, token):

        def start(config: str) -> float:
            if config in FIRST_KERNEL_DELAYS:
                return _first_kernel_ready_seconds(root, FIRST_KERNEL_DELAYS[config])
            if config == POOLED:
                _pool_started(120)
            return _ready_seconds(base, token, KERNEL_NAMES[config])

        for config in configs:  # warm-up, not recorded
            try:
                start(config)
            except Exception as err:  # noqa: BLE001  any failure: the timed runs report it
                print(f"server warm-up of {config} failed: {err}", file=sys.stderr)
        for repetition in range(repetitions):
            for config in alternating(configs, repetition):
                _emit(config, "server", repetition, "ready_seconds", functools.partial(start, config))
    _emit(configs[-1], "server stop", 0, "containers_left", lambda: float(_kernel_containers()))


def child(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--image", required=True)
    parser.add_argument("--prefix", type=Path, required=True)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument(
        "--configs",
        nargs="+",
        default=CONFIGS,
        choices=[*CONFIGS, LOGIN, *FIRST_KERNEL_DELAYS],
        help="configurations to start",
    )
    args = parser.parse_args(argv)
    configs = args.configs
    _install(args.image, args.prefix, configs)
    if not set(FIRST_KERNEL_DELAYS) & set(configs):  # a server's default; a KernelManager starts on demand
        _manager_path(args.repetitions, configs)
    _server_path(args.repetitions, args.prefix.parent / "notebooks", configs)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(child(sys.argv[1:]))
