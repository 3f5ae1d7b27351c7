"""The service's event stream: JSON objects, error text, the reader thread and cancel hooks (no podman needed)."""

import threading
import time

import pytest

from jupyter_podman_hpc.engine.service.stream import CancelWatch, Stream, StreamBroken, error_text, json_objects


@pytest.mark.parametrize("make", [threading.Event, None], ids=["event", "callable"])
def test_cancel_watch_fires_once_for_events_and_callables(make):
    event = threading.Event()
    hook = event if make else event.is_set
    fired = []
    with CancelWatch(hook, lambda watch: fired.append(watch.cancelled.is_set())) as watch:
        time.sleep(0.15)
        assert not fired
        event.set()
        deadline = time.monotonic() + 2
        while not fired and time.monotonic() < deadline:
            time.sleep(0.01)
    assert fired == [True] and watch.cancelled.is_set()


def test_cancel_watch_without_a_hook_starts_no_thread():
    with CancelWatch(None, lambda watch: None) as watch:
        assert watch.thread is None


def test_objects_reads_several_json_documents_per_line():
    class Response:
        def iter_lines(self):
            yield b'{"stream":"a"}{"stream":"b"}'
            yield b""
            yield b'  {"error":"x"}  '

    assert list(json_objects(Response())) == [{"stream": "a"}, {"stream": "b"}, {"error": "x"}]


def test_error_text_prefers_error_then_detail():
    assert error_text({"error": "boom\n", "errorDetail": {"message": "detail"}}) == "boom"
    assert error_text({"errorDetail": {"message": "detail"}}) == "detail"


def test_stream_hands_read_errors_to_the_caller_and_survives_interruptions():
    class Response:
        def __init__(self, fail):
            self.fail = fail

        def iter_lines(self):
            yield b'{"stream":"a"}'
            yield b'{"stream":"b"}'
            if self.fail:
                raise ConnectionResetError("cut")

    stream = Stream(Response(fail=True))
    seen = []
    with pytest.raises(StreamBroken, match="cut"):
        for obj in stream:
            seen.append(obj)
    assert seen == [{"stream": "a"}, {"stream": "b"}]

    stream = Stream(Response(fail=False))
    assert next(iter(stream)) == {"stream": "a"}  # the caller stops reading here...
    assert stream.drain(timeout=5)  # ...and the rest is read to its end
