"""Pull and build through the Podman API on the real stack: progress events, failures,
cancellation, and nothing half-done left behind."""

import json
import os
import random
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from jupyter_podman_hpc.engine.base import processes
from jupyter_podman_hpc.engine.images.build import CANCEL_GRACE, TAIL_LINES, BuildError, build
from jupyter_podman_hpc.engine.images.pull import PullError, pull, pull_and_squash
from jupyter_podman_hpc.engine.service.stream import Cancelled
from jupyter_podman_hpc.engine.site.config import load_config
from jupyter_podman_hpc.engine.store.squashed import SquashStore
from tests.helpers.commands import run
from tests.helpers.hpc import cleanup_hpc, make_hpc
from tests.integration.engine.slow_registry import SlowRegistry

LAYER_MB = 12
PROXY_RATE = 4 << 20  # bytes/s: a layer takes 3 s to pull, longer than podman's 1 s progress interval


@pytest.fixture(scope="module")
def layered_image(stack):
    """A 4-layer image (tiny + two 12 MB RUN layers + a small one) in the registry under a unique tag.

    The layers are reproducible (seeded data, --timestamp 0), so the
    registry keeps one copy of their blobs however often the test runs.
    """
    builder = make_hpc(stack, "layered")
    remote = f"{stack.registry}/jph/test-layers-{uuid.uuid4().hex[:8]}:1"
    try:
        context = builder.work / "context"
        context.mkdir()
        for index in (1, 2):
            (context / f"blob{index}").write_bytes(random.Random(index).randbytes(LAYER_MB << 20))
        (context / "Containerfile").write_text(
            f"FROM {stack.tiny_image}\n"
            "RUN --mount=type=bind,source=blob1,target=/src cp /src /one\n"
            "RUN --mount=type=bind,source=blob2,target=/src cp /src /two\n"
            "RUN echo small > /three\n"
        )
        builder("build", "--timestamp", "0", "-t", "localhost/tests/layers:1", context)
        builder("push", "--tls-verify=false", "localhost/tests/layers:1", remote)
        yield remote
    finally:
        run(["skopeo", "delete", "--tls-verify=false", f"docker://{remote}"], check=False)
        cleanup_hpc(builder)


@pytest.fixture(autouse=True)
def squash_store(hpc):
    """An (empty) squashed store: `podman-hpc run/ps/image inspect` fail while it does not exist."""
    SquashStore(str(hpc.squash_dir)).init()


def local_id(hpc, ref):
    result = hpc("image", "inspect", "--format", "{{.Id}}", ref, check=False)
    return result.stdout.strip() if result.returncode == 0 else None


def working_containers(hpc):
    """buildah's working containers in the test's storage (a failed build must not leave any)."""
    return json.loads(hpc("ps", "--all", "--external", "--format", "json").stdout or "[]")


def private_services(hpc):
    """Processes and files (socket, log, TMPDIR) of per-operation services left in the test's run root."""
    marker = f"{hpc.env['PODMANHPC_RUN_ROOT']}/podman-hpc-op-"
    pids = [pid for pid in processes.parents() if any(marker in arg for arg in processes.cmdline(pid))]
    files = [str(path) for path in Path(hpc.env["PODMANHPC_RUN_ROOT"]).glob("podman-hpc-op-*")]
    return pids + files


def processes_running(*argv):
    return [pid for pid in processes.parents() if processes.cmdline(pid)[: len(argv)] == list(argv)]


class Recorder(list):
    def __init__(self):
        super().__init__()
        self.started = time.monotonic()
        self.times = []

    def __call__(self, event):
        self.append(event)
        self.times.append(time.monotonic() - self.started)

    def show(self):
        return "\n".join(f"{t:6.2f} {e.message} {e.current}/{e.total}" for t, e in zip(self.times, self, strict=True))


# --- pull ------------------------------------------------------------------------------------


def test_pull_reports_bytes_per_layer(hpc, stack, layered_image, monkeypatch):
    events = Recorder()
    with SlowRegistry(stack.registry, PROXY_RATE) as proxy:
        # The engine's podman calls inherit this process's environment.
        monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(proxy.registries_conf(hpc.work)))
        ref = layered_image.replace(stack.registry, proxy.address, 1)
        started = time.monotonic()
        image_id = pull(load_config(hpc.env), ref, events)
        took = time.monotonic() - started
    assert image_id == local_id(hpc, layered_image.replace(stack.registry, proxy.address, 1))
    assert all(e.stage == "pull" for e in events)

    downloading: dict[str, list] = {}
    for e in events:
        if e.message.startswith("Downloading"):
            downloading.setdefault(e.item, []).append(e)
    big = {layer: seen for layer, seen in downloading.items() if seen[0].total > (LAYER_MB - 1) << 20}
    assert len(big) == 2, events.show()
    for layer, seen in big.items():
        assert all(0 < e.current <= e.total == seen[0].total for e in seen)
        complete = [e for e in events if e.item == layer and e.message.startswith("Download complete")]
        assert complete and complete[-1].current == complete[-1].total == seen[0].total
    layers = {e.item for e in events if e.message.startswith(("Pulling fs layer", "Already exists"))}
    assert len(layers) >= 4  # 4 layers and the config blob; every one reported
    assert events[-1].message.startswith(f"pulled {ref}") and events[-1].fraction == 1.0
    assert private_services(hpc) == []
    print(
        f"pull of {2 * LAYER_MB} MB in 4 layers at {PROXY_RATE >> 20} MB/s: {took:.1f} s, "
        f"{len(events)} events\n{events.show()}"
    )


def test_pull_and_squash_reports_both_stages(hpc, stack):
    events = Recorder()
    result = pull_and_squash(load_config(hpc.env), stack.tiny_image, events)
    assert result.image_id == local_id(hpc, stack.tiny_image)
    assert result.squash.squashed and result.squash.image.id == result.image_id
    stages = [e.stage for e in events]
    assert stages.index("squash") > max(i for i, s in enumerate(stages) if s == "pull")
    assert any(e.item and e.stage == "pull" for e in events)  # per-layer events, even for a small image
    assert events[-1].stage == "squash" and events[-1].message.startswith("squashed")
    hpc.wipe_local_storage()
    assert "yes" in hpc("images").stdout  # in the squashed store


def test_pull_of_a_missing_image_says_why(hpc, stack):
    ref = f"{stack.registry}/jph/no-such-image-{uuid.uuid4().hex[:6]}:1"
    with pytest.raises(PullError, match=r"cannot pull .*manifest unknown"):
        pull(load_config(hpc.env), ref)
    assert private_services(hpc) == []


def cleaned_up(hpc, in_flight, timeout=120):
    """Wait until the per-operation services are gone and their temporary files removed.

    An aborted pull finishes writing the layer it is on before podman drops
    it; the engine lets that happen in the background after returning.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [
            path
            for path in map(Path, in_flight)
            if path.exists() or (path.parent != Path("/var/tmp") and path.parent.exists())
        ]
        if not private_services(hpc) and not left:
            return True
        time.sleep(0.2)
    return False


def temporary_files(hpc):
    """Files under /var/tmp that the test's per-operation services hold open (blobs being pulled)."""
    found = []
    for pid in private_services(hpc):
        if isinstance(pid, int):
            for fd in Path(f"/proc/{pid}/fd").glob("*"):
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target.startswith("/var/tmp/"):
                    found.append(target)
    return found


class CallbackFailed(Exception):
    pass


@pytest.mark.parametrize("how", ["cancel", "failing-callback"])
def test_cancelling_a_pull_stops_it_and_stores_nothing(hpc, stack, how):
    cancel = threading.Event()
    events = Recorder()
    cancelled_at = []
    in_flight = []

    def progress(event):
        events.append(event)
        if event.message.startswith("Downloading") and not cancel.is_set():
            in_flight.extend(temporary_files(hpc))
            cancelled_at.append(time.monotonic())
            cancel.set()
            if how == "failing-callback":
                raise CallbackFailed

    with pytest.raises(Cancelled if how == "cancel" else CallbackFailed):
        pull(load_config(hpc.env), stack.base_image, progress, cancel=cancel if how == "cancel" else None)
    stopped = time.monotonic() - cancelled_at[0]
    assert stopped < 5
    assert in_flight and cleaned_up(hpc, in_flight)
    assert local_id(hpc, stack.base_image) is None
    print(f"pull cancelled {stopped:.2f} s after the request; removed {in_flight}")


# --- build -----------------------------------------------------------------------------------


def test_build_streams_steps_and_output_with_args_context_and_host_network(hpc, stack):
    context = hpc.work / "context"
    (context / "src").mkdir(parents=True)
    (context / "src" / "data.txt").write_text("from the context\n")
    (context / "secret.txt").write_text("must not be sent\n")
    (context / ".containerignore").write_text("secret.txt\n")
    containerfile = (
        f"FROM {stack.tiny_image}\n"
        "ARG GREETING=none\n"
        "COPY . /ctx\n"
        'RUN ls -a /ctx && cat /ctx/src/data.txt && echo "greeting=$GREETING"\n'
        f"RUN wget -q -O- http://{stack.registry}/v2/ && echo && echo network-ok\n"
    )
    events = Recorder()
    tag = "localhost/tests/api-build:1"
    started = time.monotonic()
    image_id = build(
        load_config(hpc.env), containerfile, tag, context_dir=context, build_args={"GREETING": "hello"}, progress=events
    )
    took = time.monotonic() - started
    assert image_id == local_id(hpc, tag)

    steps = [e for e in events if e.log.startswith("STEP ")]
    assert [(e.current, e.total) for e in steps] == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5)]
    assert steps[3].message == 'STEP 4/5: RUN ls -a /ctx && cat /ctx/src/data.txt && echo "greeting=$GREETING"'
    logs = {e.log: e for e in events}
    assert logs["greeting=hello"].current == 4 and logs["greeting=hello"].message == steps[3].message
    assert "from the context" in logs and logs["network-ok"].current == 5  # RUN reaches the host's loopback
    listing = hpc("run", "--rm", tag, "ls", "-a", "/ctx").stdout.split()
    assert sorted(listing) == [".", "..", ".containerignore", "src"]  # no secret.txt, no Containerfile
    assert events[-1].message == f"built {tag} ({image_id[:12]})"
    assert working_containers(hpc) == [] and private_services(hpc) == []
    print(f"build of 5 steps: {took:.1f} s")


def test_a_failing_step_names_the_step_shows_its_output_and_tags_nothing(hpc, stack):
    config = load_config(hpc.env)
    tag = "localhost/tests/api-fail:1"
    good = build(config, f"FROM {stack.tiny_image}\nRUN echo good > /version\n", tag)
    failing = (
        f"FROM {stack.tiny_image}\n"
        "RUN echo first > /first\n"
        # (stdout and stderr reach podman through separate pipes: give stdout time to drain)
        "RUN for i in $(seq 1 40); do echo line $i; done; sleep 0.5; echo to-stderr >&2; exit 3\n"
        "RUN echo never\n"
    )
    for target, before in ((tag, good), ("localhost/tests/api-never:1", None)):
        events = Recorder()
        with pytest.raises(BuildError) as raised:
            build(config, failing, target, progress=events)
        error = raised.value
        assert (
            error.step == "STEP 3/4: RUN for i in $(seq 1 40); do echo line $i; done; sleep 0.5; "
            "echo to-stderr >&2; exit 3"
        )
        assert str(error).startswith(f"build of {target} failed at STEP 3/4: RUN for i in")
        assert "exit status 3" in str(error)
        lines = error.output.splitlines()
        assert len(lines) == TAIL_LINES and lines[-2:] == ["line 40", "to-stderr"]
        assert not any(e.log == "never" for e in events)
        assert local_id(hpc, target) == before  # the old image keeps the tag; a new tag never appears
    assert hpc("run", "--rm", tag, "cat", "/version").stdout.strip() == "good"
    assert working_containers(hpc) == [] and private_services(hpc) == []


def test_cancelling_a_long_build_stops_it_within_seconds(hpc, stack):
    cancel = threading.Event()
    cancelled_at = []

    def progress(event):
        if event.log == "sleeping" and not cancel.is_set():
            cancelled_at.append(time.monotonic())
            cancel.set()

    tag = "localhost/tests/api-cancel:1"
    with pytest.raises(Cancelled, match="cancelled at STEP 3/4: RUN echo sleeping; sleep 317"):
        build(
            load_config(hpc.env),
            f"FROM {stack.tiny_image}\nRUN echo before > /before\nRUN echo sleeping; sleep 317\nRUN echo after\n",
            tag,
            progress=progress,
            cancel=cancel,
        )
    stopped = time.monotonic() - cancelled_at[0]
    assert stopped < 5
    assert local_id(hpc, tag) is None
    assert processes_running("sleep", "317") == []
    assert working_containers(hpc) == [] and private_services(hpc) == []
    print(f"build cancelled {stopped:.2f} s after the request")


def test_cancelling_while_the_base_image_is_pulled_stops_the_build(hpc, stack):
    """Not in a RUN step: the connection is cut after a grace period and podman drops the pull."""
    cancel = threading.Event()
    timer = threading.Timer(1.0, cancel.set)
    in_flight: set[str] = set()
    done = threading.Event()

    def watch_temporary_files():
        while not done.wait(0.1):
            in_flight.update(temporary_files(hpc))

    watcher = threading.Thread(target=watch_temporary_files, daemon=True)
    timer.start()
    watcher.start()
    started = time.monotonic()
    try:
        with pytest.raises(Cancelled):
            build(
                load_config(hpc.env),
                f"FROM {stack.base_image}\nRUN echo never\n",
                "localhost/tests/api-cancel-pull:1",
                cancel=cancel,
            )
    finally:
        timer.cancel()
        done.set()
        watcher.join()
    took = time.monotonic() - started
    assert took < 1.0 + CANCEL_GRACE + 3
    assert in_flight and cleaned_up(hpc, in_flight)
    assert local_id(hpc, "localhost/tests/api-cancel-pull:1") is None
    # (podman may still complete the base image's pull when its last layer was being written:
    # then it is there whole, which is fine.)
    assert working_containers(hpc) == []
    cleaned = time.monotonic() - started
    print(
        f"build cancelled during its base image pull after {took:.1f} s, cleaned up after {cleaned:.1f} s; "
        f"removed {sorted(in_flight)}"
    )


@pytest.mark.parametrize("how", ["keyboard-interrupt", "failing-callback"])
def test_an_interrupted_caller_stops_the_build_too(hpc, stack, how):
    """Ctrl-C in a kernel, or a progress callback that fails, must not leave the build running."""

    interrupted = threading.Event()

    def progress(event):
        # the RUN step's line, however the service cut its output (a whole line, or with its newline)
        if "sleeping" in (event.log or "") and not interrupted.is_set():
            interrupted.set()
            if how == "failing-callback":
                raise CallbackFailed
            threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGINT)).start()

    tag = "localhost/tests/api-interrupted:1"
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt if how == "keyboard-interrupt" else CallbackFailed):
        build(load_config(hpc.env), f"FROM {stack.tiny_image}\nRUN echo sleeping; sleep 319\n", tag, progress=progress)
    assert time.monotonic() - started < 30
    assert processes_running("sleep", "319") == []
    assert local_id(hpc, tag) is None
    assert working_containers(hpc) == [] and private_services(hpc) == []
