"""Build-log parsing, pull events, the build context tar and cancel hooks (no podman needed)."""

import socket
import tarfile
import threading
import time

import pytest

from jupyter_podman_hpc.engine import api
from jupyter_podman_hpc.engine.api import BuildLog, parse_step
from jupyter_podman_hpc.engine.config import load_config
from jupyter_podman_hpc.engine.errors import EngineError, InvalidReference


def test_parse_step_reads_number_total_and_instruction():
    step = parse_step("STEP 3/7: RUN make -j4 && make install")
    assert (step.number, step.total, step.instruction) == (3, 7, "RUN make -j4 && make install")
    assert step.line == "STEP 3/7: RUN make -j4 && make install" and step.stage is None


def test_parse_step_knows_multi_stage_prefixes():
    step = parse_step("[1/2] STEP 1/3: FROM busybox AS builder")
    assert (step.stage, step.stages, step.number, step.total) == (1, 2, 1, 3)
    assert step.instruction == "FROM busybox AS builder"


@pytest.mark.parametrize("line", ["--> 0a1b2c3d4e5", "RUN echo STEP 1/2: no", "STEP x/y: RUN", "COMMIT img",
                                  "", "Successfully tagged localhost/x:1"])
def test_other_lines_are_not_steps(line):
    assert parse_step(line) is None


def feed_all(log, chunks):
    for chunk in chunks:
        log.feed(chunk)
    log.flush()


def test_build_log_splits_chunks_into_lines_and_attributes_them_to_steps():
    events = []
    log = BuildLog(events.append)
    feed_all(log, ["STEP 1/2: FROM tiny\nSTEP 2/2: RUN ec", "ho hi\n", "hi\nmore ", "output\n--> 0a1b2c3\n",
                   "COMMIT localhost/x:1\n", "a" * 64 + "\n"])
    steps = [e for e in events if e.log.startswith("STEP ")]
    assert [(e.current, e.total, e.message) for e in steps] == \
        [(1, 2, "STEP 1/2: FROM tiny"), (2, 2, "STEP 2/2: RUN echo hi")]
    output = [e for e in events if not e.log.startswith("STEP ")]
    assert [e.log for e in output][:2] == ["hi", "more output"]
    assert all(e.stage == "build" and e.message == "STEP 2/2: RUN echo hi" and e.current == 2 for e in output)
    assert log.image_id == "a" * 64
    assert list(log.step_output) == ["hi", "more output"]  # "-->", COMMIT and the id are not step output


def test_build_log_keeps_the_last_lines_of_the_failing_step():
    log = BuildLog()
    feed_all(log, ["STEP 1/2: FROM tiny\n", "STEP 2/2: RUN seq 30; exit 3\n"] + [f"{i}\n" for i in range(1, 31)])
    error = log.failure('building at STEP "RUN seq 30; exit 3": while running runtime: exit status 3\n',
                        "localhost/x:1")
    assert isinstance(error, EngineError)
    assert error.step == "STEP 2/2: RUN seq 30; exit 3"
    assert error.reason == "while running runtime: exit status 3"
    assert str(error) == "build of localhost/x:1 failed at STEP 2/2: RUN seq 30; exit 3: " \
                         "while running runtime: exit status 3"
    lines = error.output.splitlines()
    assert len(lines) == api.TAIL_LINES and lines[-1] == "30" and lines[0] == "11"


def test_build_failure_without_a_step_line_names_the_instruction_from_the_error():
    error = BuildLog().failure('building at STEP "COPY missing /x": checking on sources: no such file',
                               "localhost/x:1")
    assert error.step == "STEP: COPY missing /x" and "no such file" in str(error)
    plain = BuildLog().failure("Containerfile: no FROM", "localhost/x:1")
    assert str(plain) == "build of localhost/x:1 failed: Containerfile: no FROM" and plain.step == ""


def test_pull_events_carry_bytes_per_layer():
    events, totals = [], {}
    for event in [
        {"status": "Pulling fs layer", "progressDetail": {}, "id": "aaa"},
        {"status": "Downloading", "progressDetail": {"current": 10, "total": 100}, "id": "aaa"},
        {"status": "Downloading", "progressDetail": {"current": 60, "total": 100}, "id": "aaa"},
        {"status": "Already exists", "progressDetail": {}, "id": "bbb"},
        {"status": "Download complete", "progressDetail": {}, "id": "aaa"},
    ]:
        api._pull_event(event, totals, events.append)
    assert [(e.message, e.current, e.total, e.item) for e in events] == [
        ("Pulling fs layer aaa", 0, None, "aaa"),
        ("Downloading aaa", 10, 100, "aaa"),
        ("Downloading aaa", 60, 100, "aaa"),
        ("Already exists bbb", None, None, "bbb"),
        ("Download complete aaa", 100, 100, "aaa"),
    ]
    assert all(e.stage == "pull" for e in events)


def members(body):
    with tarfile.open(fileobj=body) as tar:
        return {m.name: (tar.extractfile(m).read().decode() if m.isfile() else m) for m in tar.getmembers()}


def test_context_tar_without_a_context_holds_only_the_containerfile_and_its_ignore_file():
    with api._context_tar(None, "FROM x\n", ".cf") as body:
        found = members(body)
    assert found == {".cf": "FROM x\n", ".containerignore": ".cf\n.containerignore\n"}


def test_context_tar_extends_the_contexts_ignore_file(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("print(1)\n")
    (tmp_path / ".dockerignore").write_text("*.log\n")
    (tmp_path / "link").symlink_to("src/a.py")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "sock"))  # sockets are not sent
    try:
        with api._context_tar(tmp_path, "FROM x\n", ".cf") as body:
            found = members(body)
            body.seek(0)
            with tarfile.open(fileobj=body) as tar:
                owners = {(m.uid, m.gid) for m in tar.getmembers()}
    finally:
        listener.close()
    assert found[".dockerignore"] == "*.log\n.cf\n" and ".containerignore" not in found
    assert found["src/a.py"] == "print(1)\n" and found["link"].issym() and "sock" not in found
    assert owners == {(0, 0)}


def test_cancel_watch_fires_once_for_events_and_callables():
    for make in (threading.Event, None):
        event = threading.Event()
        hook = event if make else event.is_set
        fired = []
        with api._CancelWatch(hook, lambda watch: fired.append(watch.cancelled.is_set())) as watch:
            time.sleep(0.15)
            assert not fired
            event.set()
            deadline = time.monotonic() + 2
            while not fired and time.monotonic() < deadline:
                time.sleep(0.01)
        assert fired == [True] and watch.cancelled.is_set()
    with api._CancelWatch(None, lambda watch: None) as watch:
        assert watch.thread is None


def test_build_rejects_bad_input_before_starting_podman(tmp_path):
    config = load_config({"PODMANHPC_RUN_ROOT": str(tmp_path / "run")})
    with pytest.raises(InvalidReference):
        api.build(config, "FROM x\n", "Not A Tag")
    with pytest.raises(EngineError, match="is not a directory"):
        api.build(config, "FROM x\n", "localhost/x:1", context_dir=tmp_path / "missing")
    with pytest.raises(EngineError, match="Containerfile is empty"):
        api.build(config, "  \n", "localhost/x:1")
    with pytest.raises(InvalidReference):
        api.pull(config, "BAD REF")
    assert not (tmp_path / "run").exists()


def test_objects_reads_several_json_documents_per_line():
    class Response:
        def iter_lines(self):
            yield b'{"stream":"a"}{"stream":"b"}'
            yield b""
            yield b'  {"error":"x"}  '

    assert list(api._objects(Response())) == [{"stream": "a"}, {"stream": "b"}, {"error": "x"}]


def test_error_text_prefers_error_then_detail():
    assert api._error_text({"error": "boom\n", "errorDetail": {"message": "detail"}}) == "boom"
    assert api._error_text({"errorDetail": {"message": "detail"}}) == "detail"


def test_stream_hands_read_errors_to_the_caller_and_survives_interruptions():
    class Response:
        def __init__(self, fail):
            self.fail = fail

        def iter_lines(self):
            yield b'{"stream":"a"}'
            yield b'{"stream":"b"}'
            if self.fail:
                raise ConnectionResetError("cut")

    stream = api._Stream(Response(fail=True))
    seen = []
    with pytest.raises(api._StreamBroken, match="cut"):
        for obj in stream:
            seen.append(obj)
    assert seen == [{"stream": "a"}, {"stream": "b"}]

    stream = api._Stream(Response(fail=False))
    assert next(iter(stream)) == {"stream": "a"}  # the caller stops reading here...
    assert stream.drain(timeout=5)                # ...and the rest is read to its end


@pytest.mark.parametrize("failure, said", [
    ('writing blob: storing blob to file "/var/tmp/storage1/2": happened during read: unexpected EOF',
     "cannot pull 127.0.0.1:5999/team/x:1: the registry 127.0.0.1:5999 stopped answering during the pull "
     "(unexpected EOF): pull again once it answers"),
    ("initializing source docker://127.0.0.1:5999/team/x:1: pinging container registry 127.0.0.1:5999: "
     "Get \"http://127.0.0.1:5999/v2/\": dial tcp 127.0.0.1:5999: connect: connection refused",
     "cannot pull 127.0.0.1:5999/team/x:1: the registry 127.0.0.1:5999 stopped answering during the pull "
     "(connection refused): pull again once it answers"),
    ("reading manifest 1 in 127.0.0.1:5999/team/x: manifest unknown", None),
])
def test_a_registry_lost_mid_pull_is_said_as_such(failure, said):
    ref = "127.0.0.1:5999/team/x:1"
    lost = api._lost_registry(ref, failure)
    assert (f"cannot pull {ref}: {lost}" if lost else None) == said
