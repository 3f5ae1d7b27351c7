"""The event stream of the per-user Podman REST service (``engine.service.rest``), and its cancellation.

``engine.images.pull`` and ``engine.images.build`` read what podman streams through these:
the JSON objects of a streamed response (one or more per line, read by a thread
of its own), podman's error text, the image id a reference names, and a
``cancel`` hook watched in a thread.

Cancellation (``cancel``: a ``threading.Event`` or a callable returning True
once the operation should stop; a KeyboardInterrupt or an exception from the
progress callback is handled the same way and then re-raised) stops a pull by
shutting the request's connection down (``cut_connection``: ``socket.shutdown``, not just
``close()``: a response closed from another thread is not always noticed);
a build needs more (see ``engine.images.build``).
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from urllib.parse import quote

from ..errors import EngineError
from .rest import PrivateService

CancelHook = threading.Event | Callable[[], bool] | None

CANCEL_POLL = 0.1  # seconds between looks at the cancel hook


class Cancelled(EngineError):
    """The operation was cancelled through its ``cancel`` hook."""

    exit_code = 130


# --- cancellation -------------------------------------------------------------------


def cancel_requested(cancel: CancelHook) -> bool:
    """Whether the ``cancel`` hook has fired (never for None)."""
    if cancel is None:
        return False
    if isinstance(cancel, threading.Event):
        return cancel.is_set()
    return bool(cancel())


class CancelWatch:
    """Watches the hook in a thread; once it fires, calls ``on_cancel(watch)`` there."""

    def __init__(self, cancel: CancelHook, on_cancel: Callable[[CancelWatch], None]):
        self.cancel = cancel
        self.on_cancel = on_cancel
        self.cancelled = threading.Event()
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def __enter__(self) -> CancelWatch:
        if self.cancel is not None:
            self.thread = threading.Thread(target=self._watch, name="podman-hpc-cancel", daemon=True)
            self.thread.start()
        return self

    def _watch(self) -> None:
        while not self.done.is_set():
            if cancel_requested(self.cancel):
                self.cancelled.set()
                self.on_cancel(self)
                return
            if isinstance(self.cancel, threading.Event):
                self.cancel.wait(CANCEL_POLL)
            else:
                self.done.wait(CANCEL_POLL)

    def __exit__(self, *exc) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join(timeout=30)


def cut_connection(response, service: PrivateService | None = None) -> None:
    """Shut the streaming response's connection down, so podman sees the client go away."""
    if service is not None:
        service.aborted = True
    sock = None
    with contextlib.suppress(Exception):
        sock = response.raw.connection.sock
    if sock is None:
        with contextlib.suppress(Exception):
            sock = response.raw._fp.fp.raw._sock  # urllib3 without .connection
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    else:
        with contextlib.suppress(Exception):
            response.close()


# --- streaming JSON -----------------------------------------------------------------


def json_objects(response) -> Iterator[dict]:
    """The JSON objects of a streamed response (one or more per line)."""
    decoder = json.JSONDecoder()
    for raw in response.iter_lines():
        text = raw.decode(errors="replace").strip() if isinstance(raw, bytes) else raw.strip()
        while text:
            try:
                obj, end = decoder.raw_decode(text)
            except ValueError:
                break
            if isinstance(obj, dict):
                yield obj
            text = text[end:].lstrip()


class StreamBroken(Exception):
    """Reading the response failed: the connection was cut or podman went away."""


class Stream:
    """A streamed response's JSON objects, read by a thread of its own.

    The caller iterates in its own thread, so an interruption there (a
    KeyboardInterrupt in a kernel, a failing progress callback) leaves the
    stream intact: ``drain()`` can still read it to its end, which is how
    we know podman has finished with a build it was told to stop.
    """

    _END = object()

    def __init__(self, response):
        self.response = response
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._read, name="podman-hpc-stream", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for obj in json_objects(self.response):
                self.queue.put(obj)
            self.queue.put(self._END)
        except BaseException as err:  # noqa: BLE001  whatever stops the reader is handed to the caller's thread
            broken = StreamBroken(str(err) or type(err).__name__)
            broken.__cause__ = err
            self.queue.put(broken)

    def __iter__(self) -> Iterator[dict]:
        while True:
            item = self.queue.get()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def drain(self, timeout: float) -> bool:
        """Read and drop the rest of the stream; whether it ended within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                item = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return False
            if item is self._END or isinstance(item, BaseException):
                return True


def error_text(obj: Mapping) -> str:
    """podman's message in an ``{"error": ...}`` / ``{"errorDetail": ...}`` event."""
    detail = obj.get("errorDetail")
    message = obj.get("error") or (detail.get("message") if isinstance(detail, Mapping) else "")
    return str(message or "unknown error").strip()


def response_error(response) -> str:
    """podman's message from a non-2xx response body."""
    try:
        body = response.json()
    except ValueError:
        return (response.text or f"HTTP {response.status_code}").strip()
    if isinstance(body, Mapping):
        return str(body.get("message") or body.get("cause") or body).strip()
    return str(body)


def stored_image_id(api, ref: str) -> str | None:
    """The id of the image ``ref`` names in the service's storage, None if there is none."""
    response = api.get(f"/images/{quote(ref, safe='/:@')}/json")
    if response.status_code == 404:
        return None
    if response.status_code >= 400:
        raise EngineError(f"cannot inspect {ref}: {response_error(response)}")
    return response.json().get("Id")


__all__ = [
    "CancelHook",
    "CancelWatch",
    "Cancelled",
    "Stream",
    "StreamBroken",
    "cancel_requested",
    "cut_connection",
    "error_text",
    "json_objects",
    "response_error",
    "stored_image_id",
]
