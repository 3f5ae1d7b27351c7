"""The registry goes away in the middle of a pull, from the REST API and from the magic.

The registry the pull talks to is a process of the test's own in front of the stack's
(``registry_front``): it is SIGKILLed while a layer's body is on its way, and started again on
the same port for the retry. (The tests run as the stack's user, who cannot signal the stack's
registry, and other tests pull from that registry at the same time.) Expected: one line, the
task ends failed in its event stream, no image (half or whole) in the local storage or the
squashed store, nothing half-written there, and the retry succeeds."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from tests.helpers.faults import one_line
from tests.helpers.magics_kernel import start_session
from tests.helpers.server_extension import events, finished

pytestmark = [pytest.mark.faults, pytest.mark.integration]
SLOW = 512 << 10  # bytes per second of a layer's body: the 12 MB layer takes about 20 s
FAST = 256 << 20


def nothing_of(hpc, ref: str) -> None:
    """No image named ``ref`` in the local storage or the squashed store, no partial squash file."""
    assert hpc("image", "exists", ref, check=False).returncode == 1
    records = hpc.squash_dir / "overlay-images" / "images.json"
    names = [n for r in json.loads(records.read_text()) for n in r.get("names") or []] if records.exists() else []
    assert ref not in names
    links = hpc.squash_dir / "overlay" / "l"
    assert not [p.name for p in links.glob(".*")] if links.is_dir() else True


@pytest.fixture
def server_env(hpc, registry_front, monkeypatch):
    """The in-process server's engine environment: the test storage, the front as a registry."""
    for key in ("PODMANHPC_GRAPH_ROOT", "PODMANHPC_RUN_ROOT", "PODMANHPC_CONFIG_HOME", "SQUASH_DIR"):
        monkeypatch.setenv(key, hpc.env[key])
    monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(registry_front.conf))
    return hpc


async def test_rest_pull_with_the_registry_gone_fails_in_one_line_and_the_retry_succeeds(
    api, server_env, registry_front, pushed_image, stack
):
    hpc = server_env
    ref = pushed_image.replace(stack.registry, registry_front.address, 1)
    registry_front.start(SLOW)
    status, task = await api("POST", "images/pull", body={"image": ref})
    assert status == 202
    await asyncio.get_running_loop().run_in_executor(None, registry_front.wait_for_blob)
    await asyncio.sleep(2)  # a few hundred KB of the layer are through
    registry_front.kill()

    done = await finished(api, task, timeout=180)
    assert done["state"] == "failed", done
    line = one_line(done["error"])
    assert line.startswith(
        f"cannot pull {ref}: the registry {registry_front.address} stopped answering during the pull ("
    ), line
    _, stream = await api("GET", "tasks", task["id"], "events")
    assert events(stream)[-1] == ("state", {"state": "failed", "result": None, "error": done["error"]})
    nothing_of(hpc, ref)

    registry_front.start(FAST)  # the registry is back
    status, task = await api("POST", "images/pull", body={"image": ref})
    done = await finished(api, task, timeout=180)
    assert done["state"] == "succeeded", done
    assert hpc("run", "--rm", ref, "wc", "-c", "/blob").stdout.split()[0] == "12000000"


def test_magic_pull_with_the_registry_gone_is_one_line_and_the_retry_succeeds(
    hpc, registry_front, pushed_image, stack, tmp_path
):
    ref = pushed_image.replace(stack.registry, registry_front.address, 1)
    kernel = start_session(hpc, tmp_path / "kernel", CONTAINERS_REGISTRIES_CONF=str(registry_front.conf))
    try:
        registry_front.start(SLOW)

        def kill_mid_pull() -> None:
            registry_front.wait_for_blob()
            threading.Event().wait(2)
            registry_front.kill()

        killer = threading.Thread(target=kill_mid_pull)
        killer.start()
        cell = kernel.execute(f"%podman_hpc pull {ref}")
        killer.join()
        assert not cell.ok, cell.show()
        line = one_line(cell.error_text)
        assert line.startswith(
            f"podman-hpc: error: cannot pull {ref}: the registry {registry_front.address} "
            "stopped answering during the pull ("
        ), cell.show()
        nothing_of(hpc, ref)

        registry_front.start(FAST)
        cell = kernel.execute(f"%podman_hpc pull {ref}")
        assert cell.ok, cell.show()
        assert hpc("image", "exists", ref).returncode == 0
    finally:
        kernel.close()
