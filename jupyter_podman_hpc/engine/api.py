"""Pull and build through the Podman REST API, with structured progress and cancellation.

The fronts (magics, server extension) call these functions; podman-py stays
inside this module and ``engine.service``.

Endpoints, chosen for what podman 4.3.1 streams:

- Pull: the Docker-compatible ``POST /images/create?fromImage=<ref>``. It
  streams Docker-style JSON lines ``{"status": "Downloading", "id": <layer>,
  "progressDetail": {"current": n, "total": m}}`` (about once a second per
  layer), "Pulling fs layer", "Already exists", "Download complete", and
  ``{"error": ...}`` on failure. The libpod endpoint (``/libpod/images/pull``,
  what podman-py's ``images.pull(stream=True)`` calls) ignores ``compatMode``
  in 4.3.1 and streams only text lines ("Copying blob ..."), without bytes.
  The compat stream carries no image id: it is read afterwards with
  ``GET /images/<ref>/json``.
- Build: libpod ``POST /build`` with a tar of the context. It streams
  ``{"stream": text}`` as the build runs ("STEP 3/7: RUN ...", the step's
  output, "--> <id>", "COMMIT", and the image id last) and
  ``{"error": ..., "errorDetail": ...}`` when a step fails. Text chunks are
  not line-aligned, so they are re-split into lines here. podman-py's
  ``images.build()`` reads the whole stream before it returns, so the
  low-level ``client.api.post(..., stream=True)`` is used instead.

Both run in a ``PrivateService`` of their own (see ``engine.service``: the
shared service sees the squashed store, which a pull or a build must not).

Cancellation (``cancel``: a ``threading.Event`` or a callable returning True
once the operation should stop; a KeyboardInterrupt or an exception from the
progress callback is handled the same way and then re-raised). Measured on
podman 4.3.1:

- Pull: the request's connection is shut down (``socket.shutdown``, not just
  ``close()``: a response closed from another thread is not always noticed).
  podman cancels the pull's context and ``Cancelled`` is raised at once. The
  layer podman is writing into the storage at that moment is finished first
  (that part ignores the context), then the copy is dropped and its
  ``/var/tmp/storage*`` files removed; if that was the last layer the image
  may even be stored, whole. The private service is stopped by a background
  thread once it is quiet (``PrivateService.quiesce``), so nothing is left
  in /var/tmp.
- Build: cutting the connection is not enough. podman cancels the build's
  context, but a RUN step already running goes on to its end (a ``RUN sleep
  60`` runs its 60 s) and only then does the build fail. What stops it at
  once is killing the step's processes: buildah runs each RUN step through a
  ``buildah-oci-runtime`` child of the service, which reaps the container's
  processes; with a service of its own per build, every process under those
  children belongs to this build. They are SIGKILLed (again every 0.2 s,
  should the next step start meanwhile); the step fails, buildah removes its
  working containers (``forcerm``) and ends the stream with the error, and
  no image is tagged. If the build is not in a RUN step (pulling its base
  image, COPY, commit) and does not end within CANCEL_GRACE seconds, the
  connection is cut too, which stops those as for a pull.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import re
import socket
import tarfile
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Union
from urllib.parse import quote

from . import reference
from .config import SiteConfig
from .errors import EngineError, InvalidInput
from .migrate import MigrateResult, migrate
from .podman import Podman
from .progress import Progress, ProgressCallback, ignore
from .service import PrivateService

CancelHook = Union[threading.Event, Callable[[], bool], None]

TAIL_LINES = 20           # lines of a failed step's output kept in BuildError
CANCEL_POLL = 0.1         # seconds between looks at the cancel hook
CANCEL_GRACE = 3.0        # seconds a cancelled build may take to end before its connection is cut

STEP = re.compile(r"^(?:\[(?P<stage>\d+)/(?P<stages>\d+)\]\s+)?"
                  r"STEP (?P<number>\d+)/(?P<total>\d+): (?P<instruction>.*)$")
_FAILED_AT = re.compile(r'^building at STEP "(?P<instruction>.*)": (?P<reason>.*)$', re.S)
_IMAGE_ID = re.compile(r"^[0-9a-f]{64}$")


class BuildError(EngineError):
    """A build failed: ``step`` is the failing step ("STEP 3/4: RUN ..."), ``output`` its last lines."""

    def __init__(self, message: str, *, step: str = "", reason: str = "", output: str = "",
                 exit_code: int | None = None):
        super().__init__(message, exit_code)
        self.step = step
        self.reason = reason
        self.output = output


class PullError(EngineError):
    """A pull failed; the message is podman's."""


class Cancelled(EngineError):
    """The operation was cancelled through its ``cancel`` hook."""

    exit_code = 130


# --- cancellation -------------------------------------------------------------------


def _is_set(cancel: CancelHook) -> bool:
    if cancel is None:
        return False
    if isinstance(cancel, threading.Event):
        return cancel.is_set()
    return bool(cancel())


class _CancelWatch:
    """Watches the hook in a thread; once it fires, calls ``on_cancel(watch)`` there."""

    def __init__(self, cancel: CancelHook, on_cancel: Callable[["_CancelWatch"], None]):
        self.cancel = cancel
        self.on_cancel = on_cancel
        self.cancelled = threading.Event()
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def __enter__(self) -> "_CancelWatch":
        if self.cancel is not None:
            self.thread = threading.Thread(target=self._watch, name="podman-hpc-cancel", daemon=True)
            self.thread.start()
        return self

    def _watch(self) -> None:
        while not self.done.is_set():
            if _is_set(self.cancel):
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


def _cut(response, service: PrivateService | None = None) -> None:
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


def _objects(response) -> Iterator[dict]:
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


class _StreamBroken(Exception):
    """Reading the response failed: the connection was cut or podman went away."""


class _Stream:
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
            for obj in _objects(self.response):
                self.queue.put(obj)
            self.queue.put(self._END)
        except BaseException as err:  # handed to the caller's thread
            broken = _StreamBroken(str(err) or type(err).__name__)
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


def _error_text(obj: Mapping) -> str:
    detail = obj.get("errorDetail")
    message = obj.get("error") or (detail.get("message") if isinstance(detail, Mapping) else "")
    return str(message or "unknown error").strip()


def _response_error(response) -> str:
    """podman's message from a non-2xx response body."""
    try:
        body = response.json()
    except ValueError:
        return (response.text or f"HTTP {response.status_code}").strip()
    if isinstance(body, Mapping):
        return str(body.get("message") or body.get("cause") or body).strip()
    return str(body)


# --- pull -----------------------------------------------------------------------------


def pull(config: SiteConfig, ref: str, progress: ProgressCallback = ignore, *,
         cancel: CancelHook = None, environ: Mapping[str, str] | None = None) -> str:
    """Pull ``ref`` into the node-local storage through the API; the image id.

    Emits ``Progress(stage="pull")`` events: per layer (``item`` = the layer's
    short digest) "Pulling fs layer", "Downloading" with ``current``/``total``
    bytes, "Download complete" / "Already exists"; then "pulled <ref>".
    ``environ`` is the environment podman runs with (default: this process's).
    """
    ref = reference.validate(ref)
    progress(Progress("pull", f"pulling {ref}"))
    totals: dict[str, int] = {}
    with PrivateService(config, environ=environ) as service:
        api = service.client().api
        response = api.post("/images/create", params={"fromImage": ref}, stream=True, compatible=True)
        if response.status_code >= 400:
            raise PullError(f"cannot pull {ref}: {_response_error(response)}")
        with _CancelWatch(cancel, lambda _: _cut(response, service)) as watch:
            failure = None
            try:
                for event in _Stream(response):
                    if "error" in event or "errorDetail" in event:
                        failure = _error_text(event)
                        break
                    _pull_event(event, totals, progress)
            except _StreamBroken as err:
                if watch.cancelled.is_set():
                    raise Cancelled(f"the pull of {ref} was cancelled")
                raise PullError(f"the pull of {ref} was interrupted: {err} (podman: {service.last_log_line()})")
            except BaseException:
                _cut(response, service)  # KeyboardInterrupt or a failing callback: podman drops the pull
                raise
            finally:
                response.close()
            if failure is not None:
                raise PullError(f"cannot pull {ref}: {_lost_registry(ref, failure) or failure}")
            if watch.cancelled.is_set():
                # The stream may end cleanly when cut: trust only an image that is there.
                image_id = _image_id(api, ref)
                if image_id is None:
                    raise Cancelled(f"the pull of {ref} was cancelled")
        image_id = _image_id(api, ref)
        if image_id is None:
            raise PullError(f"cannot pull {ref}: podman reported no error but stored no image")
    progress(Progress("pull", f"pulled {ref} ({image_id[:12]})", 1, 1))
    return image_id


def _pull_event(event: Mapping, totals: dict[str, int], progress: ProgressCallback) -> None:
    status = str(event.get("status") or "").strip()
    layer = str(event.get("id") or "")
    if not status:
        return
    detail = event.get("progressDetail") or {}
    current, total = detail.get("current"), detail.get("total")
    if isinstance(total, int) and total > 0:
        totals[layer] = total
    known = totals.get(layer)
    if status == "Downloading" and isinstance(current, int):
        progress(Progress("pull", f"Downloading {layer}", current, total if isinstance(total, int) else known,
                          item=layer))
    elif status in ("Download complete", "Already exists", "Pull complete"):
        progress(Progress("pull", f"{status} {layer}".strip(), known, known, item=layer))
    elif status == "Pulling fs layer":
        progress(Progress("pull", f"{status} {layer}", 0, None, item=layer))
    else:
        progress(Progress("pull", f"{status} {layer}".strip(), item=layer))


def _image_id(api, ref: str) -> str | None:
    response = api.get(f"/images/{quote(ref, safe='/:@')}/json")
    if response.status_code == 404:
        return None
    if response.status_code >= 400:
        raise EngineError(f"cannot inspect {ref}: {_response_error(response)}")
    return response.json().get("Id")


@dataclass(frozen=True)
class PullResult:
    image_id: str
    squash: MigrateResult


# how a registry that went away (killed, restarted, network lost) ends a pull, in podman's words
_TRANSPORT_ENDS = ("unexpected EOF", "connection refused", "connection reset by peer", "broken pipe",
                   "i/o timeout", "no route to host")


def _lost_registry(ref: str, failure: str) -> str:
    """Podman's error as what happened, when the registry stopped answering mid-pull ('' otherwise):
    podman names the temporary blob file it was writing, not the registry it lost."""
    end = next((words for words in _TRANSPORT_ENDS if failure.rstrip().endswith(words)), "")
    if not end:
        return ""
    try:
        registry = reference.parse(ref).domain
    except EngineError:
        registry = "the registry"
    return f"the registry {registry} stopped answering during the pull ({end}): pull again once it answers"


def pull_and_squash(config: SiteConfig, ref: str, progress: ProgressCallback = ignore, *,
                    cancel: CancelHook = None, environ: Mapping[str, str] | None = None) -> PullResult:
    """``pull`` then squash into the squashed store (``engine.migrate``), with both stages' progress.

    ``cancel`` stops the pull; once squashing has started it runs to its end
    (it writes under a temporary name, so an interrupted squash leaves nothing).
    """
    ref = reference.normalize(ref)
    image_id = pull(config, ref, progress, cancel=cancel, environ=environ)
    if _is_set(cancel):
        raise Cancelled(f"cancelled after pulling {ref}, before squashing it")
    progress(Progress("squash", f"squashing {ref}"))
    return PullResult(image_id, migrate(Podman(config, environ), ref, progress))


# --- build ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    number: int
    total: int
    instruction: str        # "RUN make"
    line: str               # "STEP 3/7: RUN make" (with a "[1/2] " stage prefix in multi-stage builds)
    stage: int | None = None
    stages: int | None = None


def parse_step(line: str) -> Step | None:
    """A "STEP n/m: ..." line of buildah's output, else None."""
    match = STEP.match(line.strip())
    if not match:
        return None
    stage = match.group("stage")
    return Step(int(match.group("number")), int(match.group("total")), match.group("instruction"),
                line.strip(), int(stage) if stage else None,
                int(match.group("stages")) if stage else None)


class BuildLog:
    """Turns the build's text stream into Progress events; remembers the current step and its output."""

    def __init__(self, progress: ProgressCallback = ignore, tail: int = TAIL_LINES):
        self.progress = progress
        self.step: Step | None = None
        self.step_output: deque[str] = deque(maxlen=tail)
        self.image_id = ""
        self._partial = ""

    def feed(self, text: str) -> None:
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            self.line(line)

    def flush(self) -> None:
        if self._partial:
            line, self._partial = self._partial, ""
            self.line(line)

    def line(self, line: str) -> None:
        line = line.rstrip("\r")
        step = parse_step(line)
        if step is not None:
            self.step = step
            self.step_output.clear()
            self.progress(Progress("build", step.line, step.number, step.total,
                                   item=self._item(step), log=step.line))
            return
        if _IMAGE_ID.match(line.strip()):
            self.image_id = line.strip()
        if not line.startswith("--> ") and not line.startswith("COMMIT ") and not _IMAGE_ID.match(line):
            self.step_output.append(line)
        step = self.step
        self.progress(Progress("build", step.line if step else "", step.number if step else None,
                               step.total if step else None, item=self._item(step) if step else "",
                               log=line))

    @staticmethod
    def _item(step: Step) -> str:
        text = f"STEP {step.number}/{step.total}"
        return f"[{step.stage}/{step.stages}] {text}" if step.stage else text

    def failure(self, error: str, tag: str) -> BuildError:
        """The BuildError for podman's error text."""
        match = _FAILED_AT.match(error.strip())
        reason = (match.group("reason") if match else error).strip()
        step_line = self.step.line if self.step else ""
        if match and self.step and self.step.instruction.strip() != match.group("instruction").strip():
            step_line = f"STEP: {match.group('instruction').strip()}"
        elif match and not self.step:
            step_line = f"STEP: {match.group('instruction').strip()}"
        output = "\n".join(self.step_output)
        where = f" at {step_line}" if step_line else ""
        return BuildError(f"build of {tag} failed{where}: {reason}", step=step_line, reason=reason,
                          output=output)


def build(config: SiteConfig, containerfile: str, tag: str, context_dir: str | os.PathLike | None = None,
          build_args: Mapping[str, str] | None = None, progress: ProgressCallback = ignore, *,
          cancel: CancelHook = None, no_cache: bool = False, environ: Mapping[str, str] | None = None) -> str:
    """Build ``containerfile`` (its text) as ``tag`` through the API; the image id.

    The context is ``context_dir`` (its ``.containerignore``/``.dockerignore``
    apply, as with ``podman build``), else empty. The Containerfile travels in
    the context tar under a hidden name that the ignore file excludes, so it
    never lands in the image. RUN steps use ``network`` from the site
    configuration when set, else containers.conf's (``netns = "host"`` on
    HPC nodes without /dev/net/tun).

    Emits ``Progress(stage="build")``: one event per "STEP n/m: ..." line
    (``current``=n, ``total``=m, ``message`` and ``log`` = the line) and one
    per output line (``log`` = the line, ``message`` = the current step).
    A failed step raises BuildError (the step, podman's reason, the last
    lines of the step's output); ``tag`` is then left as it was before.
    """
    reference.parse(tag)
    if containerfile is None or not str(containerfile).strip():
        raise InvalidInput("the Containerfile is empty: give at least a FROM line")
    args = {str(k): str(v) for k, v in (build_args or {}).items()}
    for key in args:
        if not key or "=" in key:
            raise InvalidInput(f"invalid build argument name {key!r}")
    context = Path(context_dir).expanduser() if context_dir is not None else None
    if context is not None and not context.is_dir():
        raise InvalidInput(f"the build context {context} is not a directory")

    name = f".podman-hpc-containerfile-{os.urandom(6).hex()}"
    params: dict[str, object] = {"dockerfile": name, "t": tag, "rm": True, "forcerm": True, "layers": True}
    if args:
        params["buildargs"] = json.dumps(args)
    if config.network:
        params["networkmode"] = config.network
    if no_cache:
        params["nocache"] = True

    log = BuildLog(progress)
    with _context_tar(context, containerfile, name) as body, PrivateService(config, environ=environ) as service:
        api = service.client().api
        before = _image_id(api, tag)
        response = api.post("/build", params=params, data=body,
                            headers={"Content-Type": "application/x-tar"}, stream=True)
        if response.status_code >= 400:
            raise BuildError(f"build of {tag} failed: {_response_error(response)}")
        error = None
        events = _Stream(response)
        with _CancelWatch(cancel, lambda watch: _stop_build(service, response, watch.done)) as watch:
            try:
                for event in events:
                    if "stream" in event:
                        log.feed(str(event["stream"]))
                    if "error" in event or "errorDetail" in event:
                        error = _error_text(event)
                log.flush()
            except _StreamBroken as err:
                if not watch.cancelled.is_set():
                    raise BuildError(f"build of {tag} was interrupted: {err} (podman: {service.last_log_line()})",
                                     step=_line(log.step), output="\n".join(log.step_output))
            except BaseException:
                # KeyboardInterrupt, or the progress callback failed: stop the build before re-raising.
                _abort_build(service, response, events)
                raise
            finally:
                response.close()
        if watch.cancelled.is_set() and not (log.image_id and error is None):
            _restore_tag(api, tag, before)
            where = f" at {log.step.line}" if log.step else ""
            raise Cancelled(f"the build of {tag} was cancelled{where}")
        if error is not None or not log.image_id:
            _restore_tag(api, tag, before)
            if error is None:
                raise BuildError(f"build of {tag} ended without an image", step=_line(log.step),
                                 output="\n".join(log.step_output))
            raise log.failure(error, tag)
        image_id = log.image_id
    progress(Progress("build", f"built {tag} ({image_id[:12]})", 1, 1))
    return image_id


def build_and_squash(config: SiteConfig, containerfile: str, tag: str, context_dir: str | os.PathLike | None = None,
                     build_args: Mapping[str, str] | None = None, progress: ProgressCallback = ignore, *,
                     cancel: CancelHook = None, no_cache: bool = False,
                     environ: Mapping[str, str] | None = None) -> PullResult:
    """``build`` then squash ``tag`` into the squashed store, with both stages' progress
    (``cancel`` as for ``pull_and_squash``)."""
    image_id = build(config, containerfile, tag, context_dir, build_args, progress, cancel=cancel,
                     no_cache=no_cache, environ=environ)
    if _is_set(cancel):
        raise Cancelled(f"cancelled after building {tag}, before squashing it")
    progress(Progress("squash", f"squashing {tag}"))
    return PullResult(image_id, migrate(Podman(config, environ), tag, progress))


def _line(step: Step | None) -> str:
    return step.line if step else ""


def _stop_build(service: PrivateService, response, done: threading.Event) -> None:
    """Kill the running RUN step's processes until the build ends (``done``).

    If it has not ended after CANCEL_GRACE seconds (it is pulling its base
    image, copying or committing), cut the connection: podman cancels those.
    """
    started, cut = time.monotonic(), False
    while not done.is_set():
        service.kill_containers()
        if not cut and time.monotonic() - started > CANCEL_GRACE:
            cut = True
            _cut(response, service)
        done.wait(0.2)


def _abort_build(service: PrivateService, response, events: _Stream) -> None:
    """Stop a build whose reader was interrupted: kill its steps, read the rest of its stream.

    The stream ends once podman has failed the build and removed its working
    containers; stopping the service before that would leave them behind.
    """
    done = threading.Event()
    killer = threading.Thread(target=_stop_build, args=(service, response, done), daemon=True)
    killer.start()
    try:
        events.drain(CANCEL_GRACE + 30)
    finally:
        done.set()
        killer.join(timeout=5)


def _restore_tag(api, tag: str, before: str | None) -> None:
    """After a failed build, make sure ``tag`` names what it named before (podman does not tag on failure)."""
    now = _image_id(api, tag)
    if now is not None and now != before:
        parsed = reference.parse(tag)
        api.post(f"/images/{now}/untag", params={"repo": f"{parsed.domain}/{parsed.path}",
                                                 "tag": parsed.tag or "latest"})


@contextlib.contextmanager
def _context_tar(context: Path | None, containerfile: str, name: str) -> Iterator[io.BufferedRandom]:
    """The build context as a tar file, plus the Containerfile under ``name``, excluded from COPY."""
    ignore_name = ".containerignore"
    ignore_text = ""
    if context is not None:
        for candidate in (".containerignore", ".dockerignore"):
            path = context / candidate
            if path.is_file():
                ignore_name, ignore_text = candidate, path.read_text(errors="replace")
                break
    lines = [ignore_text.rstrip("\n")] if ignore_text.strip() else []
    lines.append(name)
    if not ignore_text:
        lines.append(ignore_name)  # our own ignore file stays out of the image too
    ignore_data = ("\n".join(lines) + "\n").encode()

    def normalize(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if not (info.isfile() or info.isdir() or info.issym() or info.islnk()):
            return None  # sockets, fifos, devices
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    with tempfile.TemporaryFile(prefix="podman-hpc-context-") as body:
        with tarfile.open(fileobj=body, mode="w", format=tarfile.PAX_FORMAT) as tar:
            if context is not None:
                for entry in sorted(os.listdir(context)):
                    if entry == ignore_name or entry == name:
                        continue
                    try:
                        tar.add(context / entry, arcname=entry, filter=normalize)
                    except OSError as err:
                        raise EngineError(f"cannot read the build context: {err.strerror}: {err.filename}")
            for member, data in ((name, containerfile.encode()), (ignore_name, ignore_data)):
                info = tarfile.TarInfo(member)
                info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
                tar.addfile(info, io.BytesIO(data))
        body.seek(0)
        yield body


__all__ = ["BuildError", "BuildLog", "Cancelled", "PullError", "PullResult", "Step", "build",
           "parse_step", "pull", "pull_and_squash"]
