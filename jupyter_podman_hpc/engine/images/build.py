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
from ..podman import Podman
from ..progress import Progress, ProgressCallback, ignore
from ..service.rest import PrivateService
from ..service.stream import (
    CancelHook,
    Cancelled,
    CancelWatch,
    Stream,
    StreamBroken,
    cancel_requested,
    cut_connection,
    error_text,
    response_error,
    stored_image_id,
)
from ..site.config import SiteConfig
from .migrate import migrate
from .pull import PullResult

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
        self._partial = ""

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
        before = stored_image_id(api, tag)
        response = api.post(
            "/build", params=params, data=body, headers={"Content-Type": "application/x-tar"}, stream=True
        )
        if response.status_code >= 400:
            raise BuildError(f"build of {tag} failed: {response_error(response)}")
        error = None
        events = Stream(response)
        with CancelWatch(cancel, lambda watch: _stop_build(service, response, watch.done)) as watch:
            try:
                for event in events:
                    if "stream" in event:
                        log.feed(str(event["stream"]))
                    if "error" in event or "errorDetail" in event:
                        error = error_text(event)
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
        if watch.cancelled.is_set() and not (log.image_id and error is None):
            _restore_tag(api, tag, before)
            where = f" at {log.step.line}" if log.step else ""
            raise Cancelled(f"the build of {tag} was cancelled{where}")
        if error is not None or not log.image_id:
            _restore_tag(api, tag, before)
            if error is None:
                raise BuildError(
                    f"build of {tag} ended without an image", step=_line(log.step), output="\n".join(log.step_output)
                )
            raise log.failure(error, tag)
        image_id = log.image_id
    progress(Progress("build", f"built {tag} ({image_id[:12]})", 1, 1))
    return image_id


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
    if cancel_requested(cancel):
        raise Cancelled(f"cancelled after building {tag}, before squashing it")
    progress(Progress("squash", f"squashing {tag}"))
    return PullResult(image_id, migrate(Podman(config, environ), tag, progress))


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
                    if entry in (ignore_name, name):
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


__all__ = ["BuildError", "BuildLog", "Cancelled", "Step", "build", "build_and_squash", "parse_step"]
