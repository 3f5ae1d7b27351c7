"""Rendering the engine's Progress events in a notebook: widgets, or plain text.

A renderer is the ``progress`` callback of an engine call (``pull``,
``build``, ``migrate``...) plus ``note``/``done``/``failed`` for what the
magic itself reports. ``TextRenderer`` prints plain lines (a terminal IPython,
nbconvert, nbval, papermill); ``WidgetRenderer`` shows ipywidgets (per-layer
byte bars, the current build step, the build log in a collapsible area) and
updates them while the engine call runs. Neither calls the engine.

Which one: ``widgets_enabled`` (its docstring has the rule).
"""

from __future__ import annotations

import html
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, TextIO

from ..engine.progress import Progress
from ..engine.text import human_bytes, truth

WIDGETS_ENV = "PODMAN_HPC_WIDGETS"

LOG_KEEP = 400  # build log lines a widget shows (all of them are kept in the renderer)
MIN_INTERVAL = 0.1  # seconds between two updates of one widget (the last value is always shown)


# --- which renderer -----------------------------------------------------------------


def ipywidgets_available() -> bool:
    """ipywidgets can be imported in this kernel."""
    try:
        import ipywidgets  # noqa: F401
    except Exception:  # noqa: BLE001  a broken install raises more than ImportError: not available either
        return False
    return True


def request_allows_stdin(kernel: Any) -> bool | None:
    """``allow_stdin`` of the execute request the kernel is running (None if unknown)."""
    parent = None
    try:
        parent = kernel.get_parent("shell")
    except (TypeError, AttributeError):  # an ipykernel before 6 (no channel argument), or none at all
        try:
            parent = kernel.get_parent()
        except (TypeError, AttributeError):
            parent = None
    content = (parent or {}).get("content") if isinstance(parent, Mapping) else None
    if isinstance(content, Mapping) and "allow_stdin" in content:
        return bool(content["allow_stdin"])
    value = getattr(kernel, "_allow_stdin", None)
    return bool(value) if isinstance(value, bool) else None


def widgets_enabled(shell: Any = None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether to render with ipywidgets (else plain text); the first of these that applies decides:

    1. ``PODMAN_HPC_WIDGETS=1`` (or true/yes/on) forces widgets, ``=0`` (false/no/off)
       forces text.
    2. Not in a Jupyter kernel (``get_ipython()`` has no ``kernel``: terminal
       IPython, an embedded shell): text.
    3. ``ipywidgets`` cannot be imported: text.
    4. In a kernel: widgets if the execute request being run allows stdin
       (``allow_stdin`` in its content), else text. Front ends a person uses
       (JupyterLab, Notebook, VS Code) send ``allow_stdin: true``; the headless
       executors send false, since nobody could answer: nbclient (so
       ``jupyter nbconvert --execute``, ``jupyter execute`` and papermill) sets
       ``KernelClient.allow_stdin = False`` and nbval passes ``allow_stdin=False``
       with every cell. The kernel cannot see the front end itself (there is no
       environment variable or header field that names nbclient or nbval), and a
       widget displayed there would be saved as its text repr
       ("IntProgress(value=...)") or nothing. An interactive front end without
       the widget manager still gets widgets: set PODMAN_HPC_WIDGETS=0 there.
       Voila executes with allow_stdin false too but renders widgets: set
       PODMAN_HPC_WIDGETS=1 for it.
    """
    env = os.environ if environ is None else environ
    forced = truth(env.get(WIDGETS_ENV, ""))
    if forced is False:
        return False
    if shell is None:
        try:
            from IPython import get_ipython

            shell = get_ipython()
        except ImportError:
            shell = None
    if forced is True:
        return ipywidgets_available()
    kernel = getattr(shell, "kernel", None) if shell is not None else None
    if kernel is None or not ipywidgets_available():
        return False
    return bool(request_allows_stdin(kernel))


def make_renderer(title: str, *, widgets: bool | None = None, log: bool = False, out: TextIO | None = None) -> Renderer:
    """The renderer for an operation called ``title``: widgets if ``widgets`` (by default as
    ``widgets_enabled`` decides), else plain text to ``out`` (the cell's stdout), with the build log if
    ``log``."""
    if widgets is None:
        widgets = widgets_enabled()
    if widgets:
        return WidgetRenderer(title)
    return TextRenderer(out, log=log)


# --- formatting -------------------------------------------------------------------


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def build_kind(event: Progress) -> str:
    """What a build event is: "step" (a STEP line), "output" (a line of output) or "status"."""
    from ..engine.images.build import parse_step

    if event.log and parse_step(event.log) is not None:
        return "step"
    if event.log or event.item:
        return "output"
    return "status"


def is_outcome(event: Progress) -> bool:
    """The engine's last event of an operation ("built X (id)", "squashed X"...): the magic
    reports the outcome itself, with more detail."""
    return (
        event.stage in ("build", "squash")
        and not event.item
        and not event.log
        and event.current == 1
        and event.total == 1
    )


# --- renderers --------------------------------------------------------------------


class Renderer:
    """The progress callback of an engine call, and the magic's own lines."""

    def __init__(self) -> None:
        self.events: list[Progress] = []  # every event, for whoever wants to look (tests)
        self.log_lines: list[str] = []  # the build output, every line

    def __call__(self, event: Progress) -> None:
        self.events.append(event)
        if event.stage == "build" and build_kind(event) == "output":
            self.log_lines.append(event.log)
        self.handle(event)

    def handle(self, event: Progress) -> None:
        """Show one progress event of the engine call (each renderer in its own way)."""
        raise NotImplementedError

    def note(self, text: str) -> None:
        """A line of the magic's own (a step of its work)."""

    def done(self, text: str) -> None:
        """The operation succeeded; ``text`` says what it did."""

    def failed(self, text: str, details: str = "") -> None:
        """The operation failed; ``details`` are the last lines of output worth seeing.
        The magic raises the error itself afterwards."""

    def close(self) -> None:
        """No more events."""


class TextRenderer(Renderer):
    """Plain lines, few and stable: stage starts, build steps, finished layers, outcomes.

    Byte counts and percentages are not printed as they change (a notebook saved
    headless keeps every line); ``log=True`` also prints the build output.
    """

    def __init__(self, out: TextIO | None = None, *, log: bool = False):
        super().__init__()
        self._out = out
        self.log = log
        self._layers: dict[str, str] = {}  # layer -> the last state printed
        self._sizes: dict[str, int] = {}
        self._last = ""

    @property
    def out(self) -> TextIO:
        """Where lines go: the stream given, else the cell's stdout at the time of writing."""
        return self._out or sys.stdout  # the cell's stream at the time of writing

    def line(self, text: str) -> None:
        """Print ``text`` as a line, unless it repeats the line just printed."""
        if text == self._last:
            return
        self._last = text
        self.out.write(text + "\n")
        self.out.flush()

    def handle(self, event: Progress) -> None:
        """Print the lines an event is worth: a build step (and its output with ``log``), a pull's layers, a
        stage's message; never changing byte counts or percentages, nor the outcome (the magic reports
        it)."""
        if is_outcome(event):
            return
        if event.stage == "build":
            kind = build_kind(event)
            if kind == "step":
                self.line(event.log)
            elif kind == "output":
                if self.log:
                    self.out.write(f"    {event.log}\n")
            elif event.message:
                self.line(_capital(event.message))
        elif event.stage == "pull":
            self._pull(event)
        elif event.stage == "squash":
            if event.message and event.message != "squashing":  # mksquashfs' own percentages
                self.line(_capital(event.message))
        elif event.message:
            self.line(_capital(event.message))

    def _pull(self, event: Progress) -> None:
        layer = event.item
        if not layer:
            if event.message:
                self.line(_capital(event.message))
            return
        if event.total:
            self._sizes[layer] = event.total
        status = event.message[: -len(layer)].strip() if event.message.endswith(layer) else event.message
        if status in ("Download complete", "Pull complete"):
            state = f"downloaded ({human_bytes(self._sizes[layer])})" if layer in self._sizes else "downloaded"
        elif status == "Already exists":
            state = "already here"
        else:
            return  # "Pulling fs layer", "Downloading": not worth a line
        if self._layers.get(layer, "").startswith(("downloaded", "already")):
            return
        self._layers[layer] = state
        self.line(f"  layer {layer}: {state}")

    def note(self, text: str) -> None:
        """Print the magic's own line."""
        self.line(text)

    def done(self, text: str) -> None:
        """Print what the operation did."""
        self.line(text)

    def failed(self, text: str, details: str = "") -> None:
        """Print the last lines of output that explain the failure; only those: the magic raises the
        error itself, shown once, as the cell's error."""
        if details.strip():
            self.out.write("Last lines of output:\n")
            for line in details.rstrip("\n").splitlines():
                self.out.write(f"    {line}\n")
            self.out.flush()


class _Throttle:
    """At most one update per MIN_INTERVAL per key; ``flush`` applies what was held back."""

    def __init__(self, interval: float = MIN_INTERVAL):
        self.interval = interval
        self.last: dict[Any, float] = {}
        self.pending: dict[Any, Any] = {}

    def __call__(self, key: Any, apply) -> None:
        now = time.monotonic()
        last = self.last.get(key)
        # The first update of a key always passes: monotonic time starts near zero at boot.
        if last is None or now - last >= self.interval:
            self.last[key] = now
            self.pending.pop(key, None)
            apply()
        else:
            self.pending[key] = apply

    def flush(self) -> None:
        """Apply every update held back, now."""
        pending, self.pending = self.pending, {}
        for apply in pending.values():
            apply()


class WidgetRenderer(Renderer):
    """ipywidgets, displayed when created and updated as events arrive.

    Layout (sections appear when their stage starts)::

        <title>                       pull 127.0.0.1:5000/jph/base:bookworm
        <status>                      Downloading 06da8a61bf7f
        [pull]  one row per layer:    06da8a61bf7f [#######.....] 77.1 MB / 136.7 MB
        [build] current step:         STEP 3/7: RUN make   [###....]
                Build log (collapsed accordion, the last LOG_KEEP lines)
        [squash]                      squashing [##########] 100%
        [cluster]                     engines [######....] (registered / started)
    """

    def __init__(self, title: str, display: bool = True):
        super().__init__()
        import ipywidgets as w

        self.w = w
        self.lock = threading.RLock()
        self.throttle = _Throttle()
        self.title = w.HTML(f"<b>{html.escape(title)}</b>")
        self.status = w.HTML("")
        self.box = w.VBox([self.title, self.status])
        self.layers: dict[str, tuple[Any, Any]] = {}
        self.layer_box = None
        self.step = None
        self.steps = None
        self.log_view = None
        self.log_panel = None
        self.squash_bar = None
        self.squash_label = None
        self.engines_bar = None
        self._log_dirty = False
        self._sizes: dict[str, int] = {}
        if display:
            from IPython.display import display as show

            show(self.box)

    # --- sections --------------------------------------------------------------

    def _add(self, *children) -> None:
        self.box.children = (*self.box.children, *children)

    def _layer(self, layer: str):
        if self.layer_box is None:
            self.layer_box = self.w.VBox([])
            self._add(self.layer_box)
        if layer not in self.layers:
            bar = self.w.IntProgress(
                value=0,
                min=0,
                max=1,
                description=layer,
                layout=self.w.Layout(width="60%"),
                style={"description_width": "initial"},
            )
            label = self.w.HTML("waiting")
            self.layers[layer] = (bar, label)
            self.layer_box.children = (*self.layer_box.children, self.w.HBox([bar, label]))
        return self.layers[layer]

    def _build(self):
        if self.step is None:
            self.step = self.w.HTML("")
            self.steps = self.w.IntProgress(value=0, min=0, max=1, layout=self.w.Layout(width="60%"))
            self.log_view = self.w.HTML("<pre style='margin:0'></pre>")
            self.log_panel = self.w.Accordion(children=[self.log_view])
            self.log_panel.set_title(0, "Build log")
            self.log_panel.selected_index = None
            self._add(self.w.HBox([self.steps, self.step]), self.log_panel)

    def _squash(self):
        if self.squash_bar is None:
            self.squash_bar = self.w.FloatProgress(
                value=0.0, min=0.0, max=1.0, description="squash", layout=self.w.Layout(width="60%")
            )
            self.squash_label = self.w.HTML("")
            self._add(self.w.HBox([self.squash_bar, self.squash_label]))

    # --- events ----------------------------------------------------------------

    def handle(self, event: Progress) -> None:
        """Update the widgets of the event's stage (pull, build, squash, cluster), or the status line."""
        with self.lock:
            if event.stage == "pull":
                self._on_pull(event)
            elif event.stage == "build":
                self._on_build(event)
            elif event.stage == "squash":
                self._on_squash(event)
            elif event.stage == "cluster":
                self._on_cluster(event)
            elif event.message:
                self._set_status(event.message)

    def _set_status(self, text: str, color: str = "") -> None:
        style = f" style='color:{color}'" if color else ""
        value = f"<span{style}>{html.escape(text)}</span>"
        self.throttle("status", lambda: setattr(self.status, "value", value))

    def _on_pull(self, event: Progress) -> None:
        layer = event.item
        if not layer:
            if event.message:
                self._set_status(_capital(event.message))
            return
        bar, label = self._layer(layer)
        if event.total:
            self._sizes[layer] = event.total
        total = self._sizes.get(layer)
        status = event.message[: -len(layer)].strip() if event.message.endswith(layer) else event.message

        def apply():
            if total:
                bar.max = total
            if status == "Downloading" and event.current is not None:
                bar.value = min(event.current, bar.max)
                label.value = f"{human_bytes(event.current)} / {human_bytes(total)}"
            elif status in ("Download complete", "Pull complete", "Already exists"):
                bar.value = bar.max
                bar.bar_style = "success"
                label.value = (
                    f"{human_bytes(total)} downloaded"
                    if status != "Already exists" and total
                    else "already here"
                    if status == "Already exists"
                    else "downloaded"
                )
            elif status:
                label.value = html.escape(status)

        self.throttle(("layer", layer), apply)

    def _on_build(self, event: Progress) -> None:
        if is_outcome(event):
            return
        self._build()
        kind = build_kind(event)
        if kind == "step" or (kind == "status" and event.message):
            text = event.log or event.message
            current, total = event.current, event.total

            def apply():
                self.step.value = f"<code>{html.escape(text)}</code>"
                if total:
                    self.steps.max = total
                    self.steps.value = current or 0

            self.throttle("step", apply)
        if kind == "output":
            self._log_dirty = True
            self.throttle("log", self._show_log)

    def _show_log(self) -> None:
        if self.log_view is None:
            return
        lines = self.log_lines[-LOG_KEEP:]
        text = "\n".join(lines)
        self.log_view.value = f"<pre style='margin:0;max-height:24em;overflow:auto'>{html.escape(text)}</pre>"
        self._log_dirty = False

    def _on_squash(self, event: Progress) -> None:
        if is_outcome(event):
            return
        self._squash()
        fraction = event.fraction
        message = event.message

        def apply():
            if fraction is not None:
                self.squash_bar.value = fraction
                self.squash_label.value = f"{fraction:.0%}"
            elif message:
                self.squash_label.value = html.escape(message)

        self.throttle("squash", apply)

    def _on_cluster(self, event: Progress) -> None:
        """Engines registered out of those the job starts."""
        if self.engines_bar is None:
            self.engines_bar = self.w.IntProgress(
                value=0, min=0, max=1, description="engines", layout=self.w.Layout(width="60%")
            )
            self._add(self.engines_bar)
        current, total, message = event.current, event.total, event.message

        def apply():
            if total:
                self.engines_bar.max = total
                self.engines_bar.value = min(current or 0, total)
                if current == total:
                    self.engines_bar.bar_style = "success"
            if message:
                self.status.value = html.escape(_capital(message))

        self.throttle("cluster", apply)

    # --- the magic's own -------------------------------------------------------

    def note(self, text: str) -> None:
        """Show the magic's own line in the status line."""
        with self.lock:
            self._set_status(text)

    def done(self, text: str) -> None:
        """Show success: held-back updates applied, the bars full and green, ``text`` in the status line."""
        with self.lock:
            self.throttle.flush()
            if self.squash_bar is not None:
                self.squash_bar.value = 1.0
                self.squash_bar.bar_style = "success"
                self.squash_label.value = "done"
            if self.steps is not None:
                self.steps.value = self.steps.max
                self.steps.bar_style = "success"
            self.status.value = f"<span style='color:green'>&#10004; {html.escape(text)}</span>"

    def failed(self, text: str, details: str = "") -> None:
        """Show the failure: held-back updates applied, the bars red, ``text`` and ``details`` (the last
        lines of output) in the status line."""
        with self.lock:
            self.throttle.flush()
            for bar in (self.steps, self.engines_bar):
                if bar is not None:
                    bar.bar_style = "danger"
            tail = ""
            if details.strip():
                tail = f"<pre style='margin:0.3em 0 0 0'>{html.escape(details.rstrip())}</pre>"
            self.status.value = f"<span style='color:#c00'>&#10008; {html.escape(text)}</span>{tail}"

    def close(self) -> None:
        """No more events: apply the updates held back, and show the log's last lines if they changed."""
        with self.lock:
            self.throttle.flush()
            if self._log_dirty:
                self._show_log()


__all__ = ["WIDGETS_ENV", "Renderer", "TextRenderer", "WidgetRenderer", "make_renderer", "widgets_enabled"]
