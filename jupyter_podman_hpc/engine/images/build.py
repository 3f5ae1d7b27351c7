"""Building an image through the Podman REST service, with structured progress and cancellation.

It uses libpod ``POST /build`` with a tar of the context. That streams
``{"stream": text}`` as the build runs ("STEP 3/7: RUN ...", the step's
output, "--> <id>", "COMMIT", and the image id last) and
``{"error": ..., "errorDetail": ...}`` when a step fails. Text chunks are
not line-aligned, so they are re-split into lines here. podman-py's
``images.build()`` reads the whole stream before it returns, so the
low-level ``client.api.post(..., stream=True)`` is used instead. It runs in a
``PrivateService`` of its own (the shared service sees the squashed store,
which a build must not).

Cancelling it kills the running step's processes (``_stop_build`` says why
cutting the connection is not enough).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tarfile
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import reference
from ..errors import EngineError, InvalidInput
from ..progress import Progress, ProgressCallback, ignore
from ..service.rest import PrivateService
from ..service.stream import (
    CancelHook,
    Cancelled,
    CancelWatch,
    Stream,
    StreamBroken,
    cut_connection,
    error_text,
    stored_image_id,
)
from ..site.config import SiteConfig
from .pull import PullResult, open_stream, squash_after

TAIL_LINES = 20  # lines of a failed step's output kept in BuildError
CANCEL_GRACE = 3.0  # seconds a cancelled build may take to end before its connection is cut

STEP = re.compile(
    r"^(?:\[(?P<stage>\d+)/(?P<stages>\d+)\]\s+)?"
    r"STEP (?P<number>\d+)/(?P<total>\d+): (?P<instruction>.*)$"
)
_FAILED_AT = re.compile(r'^building at STEP "(?P<instruction>.*)": (?P<reason>.*)$', re.S)
_IMAGE_ID = re.compile(r"^[0-9a-f]{64}$")


class BuildError(EngineError):
    """A build failed: ``step`` is the failing step ("STEP 3/4: RUN ..."), ``output`` its last lines."""

    def __init__(
        self, message: str, *, step: str = "", reason: str = "", output: str = "", exit_code: int | None = None
    ):
        super().__init__(message, exit_code)
        self.step = step
        self.reason = reason
        self.output = output


@dataclass(frozen=True)
class Step:
    number: int
    total: int
    instruction: str  # "RUN make"
    line: str  # "STEP 3/7: RUN make" (with a "[1/2] " stage prefix in multi-stage builds)
    stage: int | None = None
    stages: int | None = None


def parse_step(line: str) -> Step | None:
    """A "STEP n/m: ..." line of buildah's output, else None."""
    match = STEP.match(line.strip())
    if not match:
        return None
    stage = match.group("stage")
    return Step(
        int(match.group("number")),
        int(match.group("total")),
        match.group("instruction"),
        line.strip(),
        int(stage) if stage else None,
        int(match.group("stages")) if stage else None,
    )


class BuildLog:
    """Turns the build's text stream into Progress events; remembers the current step and its output."""

    def __init__(self, progress: ProgressCallback = ignore, tail: int = TAIL_LINES):
        self.progress = progress
        self.step: Step | None = None
        self.step_output: deque[str] = deque(maxlen=tail)
        self.image_id = ""
        self.error: str | None = None  # podman's error text, once the stream has sent one
        self._partial = ""

    def event(self, event: Mapping) -> None:
        """Take one event of the build's stream: its text (to ``feed``), or podman's error (to ``error``)."""
        if "stream" in event:
            self.feed(str(event["stream"]))
        if "error" in event or "errorDetail" in event:
            self.error = error_text(event)

    def feed(self, text: str) -> None:
        """Take the next chunk of podman build's output: each line it completes goes to ``line``, the rest
        waits for the next chunk (or ``flush``)."""
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            self.line(line)

    def flush(self) -> None:
        """Handle the last line of the output when it had no newline; at the end of the build."""
        if self._partial:
            line, self._partial = self._partial, ""
            self.line(line)

    def line(self, line: str) -> None:
        """Read one line of the build's output: a ``STEP n/m`` line starts a step, a bare image id is the
        built image's (``image_id``), any other line is kept as the step's output; each sends a Progress
        event with the line as its log."""
        line = line.rstrip("\r")
        step = parse_step(line)
        if step is not None:
            self.step = step
            self.step_output.clear()
            self.progress(Progress("build", step.line, step.number, step.total, item=self._item(step), log=step.line))
            return
        if _IMAGE_ID.match(line.strip()):
            self.image_id = line.strip()
        if not line.startswith("--> ") and not line.startswith("COMMIT ") and not _IMAGE_ID.match(line):
            self.step_output.append(line)
        step = self.step
        self.progress(
            Progress(
                "build",
                step.line if step else "",
                step.number if step else None,
                step.total if step else None,
                item=self._item(step) if step else "",
                log=line,
            )
        )

    @staticmethod
    def _item(step: Step) -> str:
        text = f"STEP {step.number}/{step.total}"
        return f"[{step.stage}/{step.stages}] {text}" if step.stage else text

    def failure(self, error: str, tag: str) -> BuildError:
        """The BuildError for podman's error text."""
        match = _FAILED_AT.match(error.strip())
        reason = (match.group("reason") if match else error).strip()
        step_line = self.step.line if self.step else ""
        if (match and self.step and self.step.instruction.strip() != match.group("instruction").strip()) or (
            match and not self.step
        ):
            step_line = f"STEP: {match.group('instruction').strip()}"
        output = "\n".join(self.step_output)
        where = f" at {step_line}" if step_line else ""
        return BuildError(f"build of {tag} failed{where}: {reason}", step=step_line, reason=reason, output=output)


def build(
    config: SiteConfig,
    containerfile: str,
    tag: str,
    context_dir: str | os.PathLike | None = None,
    build_args: Mapping[str, str] | None = None,
    progress: ProgressCallback = ignore,
    *,
    cancel: CancelHook = None,
    no_cache: bool = False,
    environ: Mapping[str, str] | None = None,
) -> str:
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
    _check_containerfile(containerfile)
    args = _build_args(build_args)
    context = _context(context_dir)

    name = f".podman-hpc-containerfile-{os.urandom(6).hex()}"
    params = _build_params(config, name, tag, args, no_cache)
    log = BuildLog(progress)
    with _context_tar(context, containerfile, name) as body, PrivateService(config, environ=environ) as service:
        api = service.client().api
        before = stored_image_id(api, tag)
        response = open_stream(
            api,
            "/build",
            lambda why: BuildError(f"build of {tag} failed: {why}"),
            params=params,
            data=body,
            headers={"Content-Type": "application/x-tar"},
        )
        events = Stream(response)
        with CancelWatch(cancel, lambda watch: _stop_build(service, response, watch.done)) as watch:
            _read_build(tag, service, response, events, watch, log)
        failure = _failure(tag, log, watch.cancelled.is_set())
        if failure is not None:
            _restore_tag(api, tag, before)
            raise failure
        image_id = log.image_id
    progress(Progress("build", f"built {tag} ({image_id[:12]})", 1, 1))
    return image_id


def _check_containerfile(containerfile: str) -> None:
    if containerfile is None or not str(containerfile).strip():
        raise InvalidInput("the Containerfile is empty: give at least a FROM line")


def _build_args(build_args: Mapping[str, str] | None) -> dict[str, str]:
    """The build arguments as strings; InvalidInput for a name podman could not take."""
    args = {str(k): str(v) for k, v in (build_args or {}).items()}
    for key in args:
        if not key or "=" in key:
            raise InvalidInput(f"invalid build argument name {key!r}")
    return args


def _context(context_dir: str | os.PathLike | None) -> Path | None:
    """The build context's directory (None for none); InvalidInput when it is not a directory."""
    if context_dir is None:
        return None
    context = Path(context_dir).expanduser()
    if not context.is_dir():
        raise InvalidInput(f"the build context {context} is not a directory")
    return context


def _build_params(config: SiteConfig, name: str, tag: str, args: dict[str, str], no_cache: bool) -> dict[str, object]:
    """The query of ``POST /build``: the settings every build has, then those set for this one."""
    params: dict[str, object] = {"dockerfile": name, "t": tag, "rm": True, "forcerm": True, "layers": True}
    optional = {
        "buildargs": json.dumps(args) if args else None,
        "networkmode": config.network,
        "nocache": True if no_cache else None,
    }
    params.update({key: value for key, value in optional.items() if value})
    return params


def _read_build(tag: str, service: PrivateService, response, events: Stream, watch: CancelWatch, log: BuildLog) -> None:
    """Read the build's stream into ``log`` until it ends, or was cut because the build was cancelled."""
    try:
        for event in events:
            log.event(event)
        log.flush()
    except StreamBroken as err:
        if not watch.cancelled.is_set():
            raise BuildError(
                f"build of {tag} was interrupted: {err} (podman: {service.last_log_line()})",
                step=_line(log.step),
                output="\n".join(log.step_output),
            )
    except BaseException:
        # KeyboardInterrupt, or the progress callback failed: stop the build before re-raising.
        _abort_build(service, response, events)
        raise
    finally:
        response.close()


def _failure(tag: str, log: BuildLog, cancelled: bool) -> EngineError | None:
    """Why the build that ``log`` read gave no image (None when it gave one): cancelled, podman's
    error, or no image id at the end."""
    if cancelled and not (log.image_id and log.error is None):
        where = f" at {log.step.line}" if log.step else ""
        return Cancelled(f"the build of {tag} was cancelled{where}")
    if log.error is not None:
        return log.failure(log.error, tag)
    if not log.image_id:
        return BuildError(
            f"build of {tag} ended without an image", step=_line(log.step), output="\n".join(log.step_output)
        )
    return None


def build_and_squash(
    config: SiteConfig,
    containerfile: str,
    tag: str,
    context_dir: str | os.PathLike | None = None,
    build_args: Mapping[str, str] | None = None,
    progress: ProgressCallback = ignore,
    *,
    cancel: CancelHook = None,
    no_cache: bool = False,
    environ: Mapping[str, str] | None = None,
) -> PullResult:
    """``build`` then squash ``tag`` into the squashed store, with both stages' progress
    (``cancel`` as for ``pull_and_squash``)."""
    image_id = build(
        config, containerfile, tag, context_dir, build_args, progress, cancel=cancel, no_cache=no_cache, environ=environ
    )
    return squash_after("building", config, tag, image_id, progress, cancel, environ)


def _line(step: Step | None) -> str:
    return step.line if step else ""


def _stop_build(service: PrivateService, response, done: threading.Event) -> None:
    """Kill the running RUN step's processes until the build ends (``done``).

    Measured on podman 4.3.1: cutting the connection is not enough. podman
    cancels the build's context, but a RUN step already running goes on to its
    end (a ``RUN sleep 60`` runs its 60 s) and only then does the build fail.
    What stops it at once is killing the step's processes: buildah runs each
    RUN step through a ``buildah-oci-runtime`` child of the service, which
    reaps the container's processes; with a service of its own per build,
    every process under those children belongs to this build. They are
    SIGKILLed (again every 0.2 s, should the next step start meanwhile); the
    step fails, buildah removes its working containers (``forcerm``) and ends
    the stream with the error, and no image is tagged. If the build is not in
    a RUN step (pulling its base image, COPY, commit) and does not end within
    CANCEL_GRACE seconds, the connection is cut too, which stops those as for
    a pull.
    """
    started, cut = time.monotonic(), False
    while not done.is_set():
        service.kill_containers()
        if not cut and time.monotonic() - started > CANCEL_GRACE:
            cut = True
            cut_connection(response, service)
        done.wait(0.2)


def _abort_build(service: PrivateService, response, events: Stream) -> None:
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
    now = stored_image_id(api, tag)
    if now is not None and now != before:
        parsed = reference.parse(tag)
        api.post(
            f"/images/{now}/untag", params={"repo": f"{parsed.domain}/{parsed.path}", "tag": parsed.tag or "latest"}
        )


@contextlib.contextmanager
def _context_tar(context: Path | None, containerfile: str, name: str) -> Iterator[io.BufferedRandom]:
    """The build context as a tar file, plus the Containerfile under ``name``, excluded from COPY."""
    ignore_name, ignore_text = _ignore_file(context)
    with tempfile.TemporaryFile(prefix="podman-hpc-context-") as body:
        with tarfile.open(fileobj=body, mode="w", format=tarfile.PAX_FORMAT) as tar:
            if context is not None:
                _add_context(tar, context, skip=(ignore_name, name))
            _add_file(tar, name, containerfile.encode())
            _add_file(tar, ignore_name, _ignore_data(ignore_name, ignore_text, name))
        body.seek(0)
        yield body


_IGNORE_FILES = (".containerignore", ".dockerignore")  # the first the context has is the one that counts


def _ignore_file(context: Path | None) -> tuple[str, str]:
    """The name and text of the context's ignore file; with none, ``.containerignore`` and no text."""
    if context is None:
        return _IGNORE_FILES[0], ""
    for candidate in _IGNORE_FILES:
        path = context / candidate
        if path.is_file():
            return candidate, path.read_text(errors="replace")
    return _IGNORE_FILES[0], ""


def _ignore_data(ignore_name: str, ignore_text: str, name: str) -> bytes:
    """The ignore file in the tar: the context's own, which also leaves out the Containerfile ``name``."""
    lines = [ignore_text.rstrip("\n")] if ignore_text.strip() else []
    lines.append(name)
    if not ignore_text:
        lines.append(ignore_name)  # our own ignore file stays out of the image too
    return ("\n".join(lines) + "\n").encode()


def _add_context(tar: tarfile.TarFile, context: Path, skip: tuple[str, ...]) -> None:
    for entry in sorted(os.listdir(context)):
        if entry in skip:
            continue
        try:
            tar.add(context / entry, arcname=entry, filter=_normalize)
        except OSError as err:
            raise EngineError(f"cannot read the build context: {err.strerror}: {err.filename}")


def _normalize(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """A context file as it goes into the tar: owned by root, or left out if not a file, directory or link."""
    if not (info.isfile() or info.isdir() or info.issym() or info.islnk()):
        return None  # sockets, fifos, devices
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _add_file(tar: tarfile.TarFile, member: str, data: bytes) -> None:
    info = tarfile.TarInfo(member)
    info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
    tar.addfile(info, io.BytesIO(data))


__all__ = ["BuildError", "BuildLog", "Cancelled", "Step", "build", "build_and_squash", "parse_step"]
