"""The Jupyter server is stopped (SIGTERM) or killed (SIGKILL) in the middle of a REST pull or build.

A real ``jupyter server`` process with the extension, in the test storage's environment: a
pull through the registry front that paces the layer (``registry_front``), or a build whose
RUN step sleeps, is under way when the server gets the signal. Expected, for both signals:
the private Podman service of the task and everything under it are gone (no process, no
socket), no build container is left in that storage (``podman ps -a --external``), no image
of the task (half or whole) is in the storage; the next server lists the task as
``interrupted`` with one line; and the same pull or build through it succeeds. After a
SIGKILL the service is first seen still running (what the next server's sweep is for).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.helpers.faults import one_line
from tests.helpers.servers import http, jupyter_server, processes_mentioning

pytestmark = [pytest.mark.faults, pytest.mark.integration]
SLOW = 256 << 10  # bytes per second of the pushed image's 12 MB layer: the pull takes about 45 s
FAST = 256 << 20
SIGNALS = [pytest.param(signal.SIGTERM, id="SIGTERM"), pytest.param(signal.SIGKILL, id="SIGKILL")]


@dataclass
class Server:
    """A ``jupyter server`` process with a token, on 127.0.0.1."""

    process: subprocess.Popen
    base: str
    token: str
    log_path: Path

    def api(self, method: str, *path: str, body: dict | None = None) -> tuple[int, dict]:
        return http(method, f"{self.base}/podman-hpc/api/{'/'.join(path)}", self.token, body)

    def task(self, task_id: str) -> dict:
        status, task = self.api("GET", "tasks", task_id)
        assert status == 200, (status, task)
        return task

    def finished(self, task_id: str, timeout: float = 300) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            task = self.task(task_id)
            if task["state"] not in ("queued", "running"):
                return task
            time.sleep(0.5)
        raise AssertionError(f"task {task_id} did not finish: {task}")


@pytest.fixture
def servers(hpc, registry_front, tmp_path):
    """Starts ``jupyter server`` processes in the test storage's environment; stops what is left."""
    root = tmp_path / "notebooks"
    root.mkdir()
    # PYTHONFAULTHANDLER: a server that does not exit can be made to print its threads (see stop_server)
    site = SimpleNamespace(
        env={
            **hpc.env,
            "CONTAINERS_REGISTRIES_CONF": str(registry_front.conf),
            "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
            "PYTHONFAULTHANDLER": "1",
        }
    )
    numbers = itertools.count()
    with contextlib.ExitStack() as running:

        def start() -> Server:
            log_path = tmp_path / f"server-{next(numbers)}.log"
            base, token, process = running.enter_context(jupyter_server(site, root, log_path))
            return Server(process, base, token, log_path)

        yield start


def services(hpc) -> list[str]:
    """The private Podman services' files in the test's run root."""
    return sorted(p.name for p in Path(hpc.env["PODMANHPC_RUN_ROOT"]).glob("podman-hpc-op-*"))


def storage_processes(hpc) -> list[int]:
    """Processes working in the test's storage: Podman services, fuse-overlayfs, conmon."""
    return processes_mentioning(hpc.env["PODMANHPC_RUN_ROOT"] + "/")


def build_containers(hpc) -> list[str]:
    listed = json.loads(hpc("ps", "--all", "--external", "--format", "json").stdout or "[]")
    return [f"{c['Id'][:12]} {c['State']} {c['Names']}" for c in listed]


def no_image(hpc, ref: str) -> None:
    """No image ``ref`` in the local storage or the squashed store, no partial squash file."""
    assert hpc("image", "exists", ref, check=False).returncode == 1
    assert ref not in hpc("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
    links = hpc.squash_dir / "overlay" / "l"
    assert not (links.is_dir() and [p.name for p in links.glob(".*")])


def wait_until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what}")


def stop_server(server: Server, sig: int, hpc) -> None:
    """Send ``sig``; the server is gone afterwards. After a SIGTERM the server itself stopped the
    service; after a SIGKILL it is still running (nobody stopped it yet)."""
    started = time.monotonic()
    server.process.send_signal(sig)
    try:
        server.process.wait(timeout=90)
    except subprocess.TimeoutExpired:
        server.process.send_signal(signal.SIGABRT)  # faulthandler writes every thread's stack to the log
        server.process.wait(timeout=30)
        raise AssertionError(
            f"the server did not exit within 90 s of {signal.Signals(sig).name}; its log:\n"
            + server.log_path.read_text()[-12000:]
        ) from None
    print(f"the server exited {time.monotonic() - started:.1f} s after {signal.Signals(sig).name}")
    if sig == signal.SIGKILL:
        assert services(hpc) and storage_processes(hpc), "the killed server's Podman service is not running"
    else:
        assert services(hpc) == [], server.log_path.read_text()[-3000:]
        assert storage_processes(hpc) == []


def nothing_left(hpc, marker: str = "") -> None:
    """No service, no process, no build container of the interrupted task (the next server's
    sweep runs in the background at its start: waited for)."""
    wait_until(
        lambda: (
            services(hpc) == [] and storage_processes(hpc) == [] and (not marker or processes_mentioning(marker) == [])
        ),
        60,
        f"the interrupted task's service and processes are gone: {services(hpc)}",
    )
    wait_until(lambda: build_containers(hpc) == [], 30, f"no build container: {build_containers(hpc)}")


def interrupted(server: Server, task_id: str, title: str) -> None:
    status, listing = server.api("GET", "tasks")
    assert status == 200
    found = {task["id"]: task for task in listing["tasks"]}
    assert task_id in found, listing
    task = found[task_id]
    assert (task["state"], task["title"]) == ("interrupted", title), task
    assert one_line(task["error"]) == f"{title} was interrupted: the server stopped while it ran; start it again"
    status, stream = server.api("GET", "tasks", task_id)
    assert status == 200 and stream["state"] == "interrupted"


@pytest.mark.parametrize("sig", SIGNALS)
def test_a_build_cut_by_a_server_restart_is_interrupted_leaves_nothing_and_builds_again(hpc, servers, stack, sig):
    pause = str(3000 + int(uuid.uuid4().hex[:3], 16))  # a RUN step that would sleep for an hour
    marker = f"sleep\x00{pause}"
    tag = f"localhost/faults/restart-{uuid.uuid4().hex[:8]}:1"
    containerfile = f"FROM {stack.tiny_image}\nARG PAUSE=0\nRUN sleep $PAUSE\n"
    server = servers()
    status, task = server.api(
        "POST", "images", "build", body={"containerfile": containerfile, "tag": tag, "build_args": {"PAUSE": pause}}
    )
    assert status == 202, task
    wait_until(lambda: processes_mentioning(marker), 120, "the RUN step is running")

    stop_server(server, sig, hpc)
    started = time.monotonic()
    after = servers()
    print(f"the next server answered within {time.monotonic() - started:.1f} s")
    interrupted(after, task["id"], f"build {tag}")
    nothing_left(hpc, marker)
    print(f"it listed the task, and nothing was left, within {time.monotonic() - started:.1f} s")
    no_image(hpc, tag)

    status, retry = after.api(
        "POST", "images", "build", body={"containerfile": containerfile, "tag": tag, "build_args": {"PAUSE": "0"}}
    )
    assert status == 202, retry
    done = after.finished(retry["id"])
    assert done["state"] == "succeeded", done
    assert hpc("image", "exists", tag).returncode == 0
    assert build_containers(hpc) == []


@pytest.mark.parametrize("sig", SIGNALS)
def test_a_pull_cut_by_a_server_restart_is_interrupted_leaves_nothing_and_pulls_again(
    hpc, servers, registry_front, pushed_image, stack, sig
):
    ref = pushed_image.replace(stack.registry, registry_front.address, 1)
    registry_front.start(SLOW)
    server = servers()
    status, task = server.api("POST", "images", "pull", body={"image": ref, "squash": False})
    assert status == 202, task
    registry_front.wait_for_blob()
    time.sleep(2)  # some of the layer is through

    stop_server(server, sig, hpc)
    started = time.monotonic()
    after = servers()
    print(f"the next server answered within {time.monotonic() - started:.1f} s")
    interrupted(after, task["id"], f"pull {ref}")
    nothing_left(hpc)
    print(f"it listed the task, and nothing was left, within {time.monotonic() - started:.1f} s")
    no_image(hpc, ref)

    registry_front.kill()
    registry_front.start(FAST)
    status, retry = after.api("POST", "images", "pull", body={"image": ref, "squash": False})
    assert status == 202, retry
    done = after.finished(retry["id"])
    assert done["state"] == "succeeded", done
    assert hpc("run", "--rm", ref, "wc", "-c", "/blob").stdout.split()[0] == "12000000"
