"""Pulling an image into the node-local storage, and squashing what was pulled.

There are two pulls, and they differ in a way that matters, so both stay, side by side:

- ``pull`` / ``pull_and_squash`` (the Jupyter fronts: magics, server
  extension) go through the Podman REST service (``engine.service.rest``) to give
  structured, per-layer progress in bytes and to be cancellable mid-pull.
- ``podman_pull`` (the CLI's ``podman-hpc pull [podman pull options] IMAGE``)
  runs ``podman pull`` itself: it passes the user's podman options through
  unchanged (``--tls-verify``, ``--creds``, ``--platform``, ...), which the
  REST endpoint below has no words for, and on a terminal podman draws its
  own progress.

The REST pull uses the Docker-compatible ``POST /images/create?fromImage=<ref>``.
It streams Docker-style JSON lines ``{"status": "Downloading", "id": <layer>,
"progressDetail": {"current": n, "total": m}}`` (about once a second per
layer), "Pulling fs layer", "Already exists", "Download complete", and
``{"error": ...}`` on failure. The libpod endpoint (``/libpod/images/pull``,
what podman-py's ``images.pull(stream=True)`` calls) ignores ``compatMode``
in 4.3.1 and streams only text lines ("Copying blob ..."), without bytes.
The compat stream carries no image id: it is read afterwards with
``GET /images/<ref>/json``. It runs in a ``PrivateService`` of its own (the
shared service sees the squashed store, which a pull must not).

Cancelling it (measured on podman 4.3.1) shuts the request's connection down:
podman cancels the pull's context and ``Cancelled`` is raised at once. The
layer podman is writing into the storage at that moment is finished first
(that part ignores the context), then the copy is dropped and its
``/var/tmp/storage*`` files removed; if that was the last layer the image
may even be stored, whole. The private service is stopped by a background
thread once it is quiet (``PrivateService.quiesce``), so nothing is left
in /var/tmp.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .. import reference
from ..base.space import free_bytes, looks_full
from ..errors import EngineError, PodmanError, StorageFull
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
from .migrate import MigrateResult, migrate


class PullError(EngineError):
    """A pull failed; the message is podman's."""


def pull(
    config: SiteConfig,
    ref: str,
    progress: ProgressCallback = ignore,
    *,
    cancel: CancelHook = None,
    environ: Mapping[str, str] | None = None,
) -> str:
    """Pull ``ref`` into the node-local storage through the API; the image id.

    Emits ``Progress(stage="pull")`` events: per layer (``item`` = the layer's
    short digest) "Pulling fs layer", "Downloading" with ``current``/``total``
    bytes, "Download complete" / "Already exists"; then "pulled <ref>".
    ``environ`` is the environment podman runs with (default: this process's).
    """
    ref = reference.validate(ref)
    progress(Progress("pull", f"pulling {ref}"))
    with PrivateService(config, environ=environ) as service:
        api = service.client().api
        response = open_stream(
            api,
            "/images/create",
            lambda why: PullError(f"cannot pull {ref}: {why}"),
            params={"fromImage": ref},
            compatible=True,
        )
        with CancelWatch(cancel, lambda _: cut_connection(response, service)) as watch:
            failure = _read_pull(ref, service, response, watch, progress)
            if failure is not None:
                raise _pull_failure(config, ref, failure)
            _check_not_cancelled(api, ref, watch)
        image_id = stored_image_id(api, ref)
        if image_id is None:
            raise PullError(f"cannot pull {ref}: podman reported no error but stored no image")
    progress(Progress("pull", f"pulled {ref} ({image_id[:12]})", 1, 1))
    return image_id


def open_stream(api, path: str, refused: Callable[[str], EngineError], **request):
    """POST ``request`` to ``path`` with a streamed response; ``refused(podman's message)`` is raised
    when podman refuses it (shared by pull and build)."""
    response = api.post(path, stream=True, **request)
    if response.status_code >= 400:
        raise refused(response_error(response))
    return response


def _read_pull(
    ref: str, service: PrivateService, response, watch: CancelWatch, progress: ProgressCallback
) -> str | None:
    """Read the pull's stream, sending its progress, until it ends (None) or podman's error comes (that)."""
    totals: dict[str, int] = {}
    try:
        for event in Stream(response):
            if "error" in event or "errorDetail" in event:
                return error_text(event)
            _pull_event(event, totals, progress)
    except StreamBroken as err:
        if watch.cancelled.is_set():
            raise Cancelled(f"the pull of {ref} was cancelled")
        raise PullError(f"the pull of {ref} was interrupted: {err} (podman: {service.last_log_line()})")
    except BaseException:
        cut_connection(response, service)  # KeyboardInterrupt or a failing callback: podman drops the pull
        raise
    finally:
        response.close()
    return None


def _pull_failure(config: SiteConfig, ref: str, failure: str) -> EngineError:
    """The error for podman's ``failure`` of the pull: a full storage, a lost registry, or podman's words."""
    full = _storage_full(config, ref, failure)
    if full:
        return StorageFull(full)
    return PullError(f"cannot pull {ref}: {_lost_registry(ref, failure) or failure}")


def _check_not_cancelled(api, ref: str, watch: CancelWatch) -> None:
    """Cancelled, when the pull was cancelled and no image is stored: the stream may end cleanly when
    cut, so only an image that is there counts."""
    if watch.cancelled.is_set() and stored_image_id(api, ref) is None:
        raise Cancelled(f"the pull of {ref} was cancelled")


def _pull_event(event: Mapping, totals: dict[str, int], progress: ProgressCallback) -> None:
    """Send the progress of one event of the pull's stream (none for an event without a status);
    ``totals`` remembers each layer's size, which later events of the layer may not repeat."""
    status = str(event.get("status") or "").strip()
    layer = str(event.get("id") or "")
    if status:
        progress(_layer_progress(status, layer, event.get("progressDetail") or {}, totals))


def _layer_progress(status: str, layer: str, detail: Mapping, totals: dict[str, int]) -> Progress:
    current, total = detail.get("current"), detail.get("total")
    if isinstance(total, int) and total > 0:
        totals[layer] = total
    known = totals.get(layer)
    if status == "Downloading" and isinstance(current, int):
        return Progress("pull", f"Downloading {layer}", current, total if isinstance(total, int) else known, item=layer)
    return _BY_STATUS.get(status, _layer_status)(status, layer, known)


def _layer_done(status: str, layer: str, known: int | None) -> Progress:
    return Progress("pull", f"{status} {layer}".strip(), known, known, item=layer)


def _layer_started(status: str, layer: str, known: int | None) -> Progress:
    return Progress("pull", f"{status} {layer}", 0, None, item=layer)


def _layer_status(status: str, layer: str, known: int | None) -> Progress:
    return Progress("pull", f"{status} {layer}".strip(), item=layer)


_BY_STATUS: dict[str, Callable[[str, str, int | None], Progress]] = {
    "Download complete": _layer_done,
    "Already exists": _layer_done,
    "Pull complete": _layer_done,
    "Pulling fs layer": _layer_started,
}


@dataclass(frozen=True)
class PullResult:
    image_id: str
    squash: MigrateResult


# how a registry that went away (killed, restarted, network lost) ends a pull, in podman's words
_TRANSPORT_ENDS = (
    "unexpected EOF",
    "connection refused",
    "connection reset by peer",
    "broken pipe",
    "i/o timeout",
    "no route to host",
)


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


def _storage_full(config: SiteConfig, ref: str, failure: str) -> str:
    """What happened, when the node-local storage filled during the pull ('' otherwise): podman
    names the layer it was applying, not the file system, and on a terminal says nothing we read."""
    if "no space left on device" not in failure.lower() and not looks_full(config.graph_root):
        return ""
    free = free_bytes(config.graph_root)
    room = f", {free >> 20} MiB free" if free is not None else ""
    return (
        f"cannot pull {ref}: the node-local storage {config.graph_root} is full (ENOSPC{room}); "
        f"free space there (podman-hpc rmi, or graph_root on a larger file system), then pull again"
    )


def pull_and_squash(
    config: SiteConfig,
    ref: str,
    progress: ProgressCallback = ignore,
    *,
    cancel: CancelHook = None,
    environ: Mapping[str, str] | None = None,
) -> PullResult:
    """``pull`` then squash into the squashed store (``engine.images.migrate``), with both stages' progress.

    ``cancel`` stops the pull; once squashing has started it runs to its end
    (it writes under a temporary name, so an interrupted squash leaves nothing).
    """
    ref = reference.normalize(ref)
    image_id = pull(config, ref, progress, cancel=cancel, environ=environ)
    return squash_after("pulling", config, ref, image_id, progress, cancel, environ)


def squash_after(
    done: str,
    config: SiteConfig,
    ref: str,
    image_id: str,
    progress: ProgressCallback,
    cancel: CancelHook,
    environ: Mapping[str, str] | None,
) -> PullResult:
    """Squash ``ref``, just ``done`` ("pulling", "building"), unless cancelled meanwhile (shared by pull
    and build)."""
    if cancel_requested(cancel):
        raise Cancelled(f"cancelled after {done} {ref}, before squashing it")
    progress(Progress("squash", f"squashing {ref}"))
    return PullResult(image_id, migrate(Podman(config, environ), ref, progress))


def podman_pull(
    podman: Podman,
    ref: str,
    *,
    squash: bool = True,
    pull_args: list[str] | None = None,
    progress: ProgressCallback = ignore,
    quiet: bool = True,
) -> MigrateResult | None:
    """``podman pull`` into the node-local storage, then squash it (unless told not to)."""
    ref = reference.normalize(ref)
    try:
        podman.run(podman.command("pull", *(pull_args or []), *(["--quiet"] if quiet else []), ref), capture=quiet)
    except PodmanError as err:
        full = _storage_full(podman.config, ref, str(err))
        if full:
            raise StorageFull(full) from None
        raise
    return migrate(podman, ref, progress) if squash else None


__all__ = ["Cancelled", "PullError", "PullResult", "podman_pull", "pull", "pull_and_squash"]
