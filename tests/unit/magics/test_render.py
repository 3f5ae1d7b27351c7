"""The progress renderers (fed with the engine's own Progress events) and the headless rule."""

import io

import pytest

from jupyter_podman_hpc.engine.images.build import BuildLog
from jupyter_podman_hpc.engine.images.pull import _pull_event
from jupyter_podman_hpc.engine.progress import Progress
from jupyter_podman_hpc.magics import render
from jupyter_podman_hpc.magics.render import TextRenderer, WidgetRenderer, widgets_enabled

BUILD_OUTPUT = (
    "STEP 1/3: FROM busybox\n"
    "STEP 2/3: RUN echo one && echo two\n"
    "one\n"
    "\n"
    "two\n"
    "--> 1a2b3c4d5e6\n"
    'STEP 3/3: CMD ["sh"]\n'
    "COMMIT localhost/x:1\n"
    "--> 9f8e7d6c5b4\n"
    "Successfully tagged localhost/x:1\n"
    "9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e\n"
)

PULL_STREAM = [
    {"status": "Pulling fs layer", "id": "aaaaaaaaaaaa"},
    {"status": "Pulling fs layer", "id": "bbbbbbbbbbbb"},
    {"status": "Downloading", "id": "aaaaaaaaaaaa", "progressDetail": {"current": 1_000_000, "total": 5_000_000}},
    {"status": "Downloading", "id": "aaaaaaaaaaaa", "progressDetail": {"current": 4_000_000, "total": 5_000_000}},
    {"status": "Already exists", "id": "bbbbbbbbbbbb"},
    {"status": "Download complete", "id": "aaaaaaaaaaaa"},
    {"status": "Download complete", "id": "aaaaaaaaaaaa"},
    {"status": "Download complete", "id": "cccccccccccc"},
]


def build_events(sink):
    log = BuildLog(sink)
    for piece in (BUILD_OUTPUT[:17], BUILD_OUTPUT[17:60], BUILD_OUTPUT[60:]):  # chunks not on line ends
        log.feed(piece)
    log.flush()
    sink(Progress("build", "built localhost/x:1 (9f8e7d6c5b4a)", 1, 1))


def pull_events(sink):
    sink(Progress("pull", "pulling registry/x:1"))
    totals = {}
    for event in PULL_STREAM:
        _pull_event(event, totals, sink)
    sink(Progress("pull", "pulled registry/x:1 (cccccccccccc)", 1, 1))
    sink(Progress("squash", "squashing registry/x:1"))
    for done in (10, 500, 1000):
        sink(Progress("squash", "squashing", done, 1000))
    sink(Progress("squash", "squashed registry/x:1", 1, 1))


# --- text ---------------------------------------------------------------------------------


def test_text_build_prints_the_steps_and_keeps_the_log():
    out = io.StringIO()
    renderer = TextRenderer(out)
    build_events(renderer)
    renderer.done("Built localhost/x:1 (9f8e7d6c5b4a)")
    assert out.getvalue().splitlines() == [
        "STEP 1/3: FROM busybox",
        "STEP 2/3: RUN echo one && echo two",
        'STEP 3/3: CMD ["sh"]',
        "Built localhost/x:1 (9f8e7d6c5b4a)",
    ]
    assert renderer.log_lines[:3] == ["one", "", "two"] and "Successfully tagged localhost/x:1" in renderer.log_lines


def test_text_build_with_log_prints_every_output_line():
    out = io.StringIO()
    build_events(TextRenderer(out, log=True))
    lines = out.getvalue().splitlines()
    assert lines[:5] == ["STEP 1/3: FROM busybox", "STEP 2/3: RUN echo one && echo two", "    one", "    ", "    two"]


def test_text_pull_prints_one_line_per_finished_layer_and_no_percentages():
    out = io.StringIO()
    renderer = TextRenderer(out)
    pull_events(renderer)
    renderer.done("Squashed registry/x:1 (cccccccccccc) into /store")
    assert out.getvalue().splitlines() == [
        "Pulling registry/x:1",
        "  layer bbbbbbbbbbbb: already here",
        "  layer aaaaaaaaaaaa: downloaded (5.0 MB)",
        "  layer cccccccccccc: downloaded",
        "Pulled registry/x:1 (cccccccccccc)",
        "Squashing registry/x:1",
        "Squashed registry/x:1 (cccccccccccc) into /store",
    ]
    assert [e.current for e in renderer.events if e.message.startswith("Downloading")] == [1_000_000, 4_000_000]


def test_text_failure_shows_the_last_lines():
    out = io.StringIO()
    renderer = TextRenderer(out)
    renderer.failed("build of x failed at STEP 2/2: RUN false: exit status 1", "compiling\nerror: oops\n")
    assert out.getvalue() == "Last lines of output:\n    compiling\n    error: oops\n"


def test_text_writes_to_the_current_stdout(capsys):
    renderer = TextRenderer()
    renderer.note("hello")
    assert capsys.readouterr().out == "hello\n"


# --- widgets (ipywidgets without a front end: models only) ---------------------------------------


@pytest.fixture
def widget_renderer(monkeypatch):
    monkeypatch.setattr(render, "MIN_INTERVAL", 0.0)
    renderer = WidgetRenderer("pull registry/x:1", display=False)
    renderer.throttle.interval = 0.0
    return renderer


def test_widgets_show_a_bar_per_layer_and_the_squash(widget_renderer):
    seen = []

    def sink(event):
        widget_renderer(event)
        if event.message == "Downloading aaaaaaaaaaaa" and event.current == 1_000_000:
            bar, label = widget_renderer.layers["aaaaaaaaaaaa"]
            seen.append((bar.value, bar.max, label.value))

    pull_events(sink)
    widget_renderer.done("Squashed registry/x:1 (cccccccccccc) into /store")
    widget_renderer.close()
    assert seen == [(1_000_000, 5_000_000, "1.0 MB / 5.0 MB")]
    bar, label = widget_renderer.layers["aaaaaaaaaaaa"]
    assert (bar.value, bar.max, bar.bar_style, label.value) == (5_000_000, 5_000_000, "success", "5.0 MB downloaded")
    assert widget_renderer.layers["bbbbbbbbbbbb"][1].value == "already here"
    assert widget_renderer.squash_bar.value == 1.0 and widget_renderer.squash_bar.bar_style == "success"
    assert "&#10004; Squashed registry/x:1" in widget_renderer.status.value


def test_widgets_show_the_step_and_the_log(widget_renderer):
    build_events(widget_renderer)
    widget_renderer.close()
    assert widget_renderer.step.value == "<code>STEP 3/3: CMD [&quot;sh&quot;]</code>"
    assert (widget_renderer.steps.value, widget_renderer.steps.max) == (3, 3)
    assert "one\n\ntwo" in widget_renderer.log_view.value
    assert widget_renderer.log_panel.selected_index is None  # collapsed until opened
    widget_renderer.failed("build failed", "error: <oops>")
    assert "&lt;oops&gt;" in widget_renderer.status.value and widget_renderer.steps.bar_style == "danger"


def test_widget_updates_are_throttled_and_the_last_one_is_kept(monkeypatch):
    renderer = WidgetRenderer("squash x", display=False)
    renderer.throttle.interval = 3600
    for done in range(1, 101):
        renderer(Progress("squash", "squashing", done, 100))
    assert renderer.squash_bar.value == 0.01  # the first one, then held back
    renderer.close()
    assert renderer.squash_bar.value == 1.0


def test_the_first_update_passes_on_a_freshly_booted_machine(monkeypatch):
    monkeypatch.setattr(render.time, "monotonic", lambda: 0.05)  # 50 ms after boot
    renderer = WidgetRenderer("squash x", display=False)
    renderer(Progress("squash", "squashing", 1, 100))
    assert renderer.squash_bar.value == 0.01


# --- which renderer ---------------------------------------------------------------------------


class FakeKernel:
    def __init__(self, content=None, allow=None):
        self.content = content
        if allow is not None:
            self._allow_stdin = allow

    def get_parent(self, channel=None):
        return {"content": self.content} if self.content is not None else {}


class FakeShell:
    def __init__(self, kernel=None):
        if kernel is not None:
            self.kernel = kernel


@pytest.mark.parametrize(
    "shell, environ, expected",
    [
        (FakeShell(), {}, False),  # terminal IPython
        (FakeShell(FakeKernel({"allow_stdin": True})), {}, True),  # JupyterLab
        (FakeShell(FakeKernel({"allow_stdin": False})), {}, False),  # nbclient, nbval
        (FakeShell(FakeKernel({"code": "1"})), {}, False),  # no flag: unknown, text
        (FakeShell(FakeKernel(None, allow=True)), {}, True),  # older ipykernel
        (FakeShell(FakeKernel({"allow_stdin": True})), {"PODMAN_HPC_WIDGETS": "0"}, False),
        (FakeShell(FakeKernel({"allow_stdin": False})), {"PODMAN_HPC_WIDGETS": "1"}, True),  # Voila
        (FakeShell(), {"PODMAN_HPC_WIDGETS": "yes"}, True),
        (FakeShell(FakeKernel({"allow_stdin": True})), {"PODMAN_HPC_WIDGETS": "auto"}, True),
    ],
)
def test_widgets_enabled(shell, environ, expected):
    assert widgets_enabled(shell, environ) is expected


def test_without_ipywidgets_it_is_text(monkeypatch):
    monkeypatch.setattr(render, "ipywidgets_available", lambda: False)
    assert widgets_enabled(FakeShell(FakeKernel({"allow_stdin": True})), {}) is False
    assert widgets_enabled(FakeShell(), {"PODMAN_HPC_WIDGETS": "1"}) is False


def test_make_renderer_follows_the_rule():
    assert isinstance(render.make_renderer("x", widgets=False), TextRenderer)
    assert isinstance(render.make_renderer("x", widgets=True), WidgetRenderer)


def test_widgets_show_the_engines_registered_of_a_cluster(widget_renderer):
    for current in (0, 3, 8):
        widget_renderer(
            Progress("cluster", f"{current}/8 engines registered (job 7 RUNNING)", current=current, total=8)
        )
        if current == 3:
            widget_renderer.close()
            bar = widget_renderer.engines_bar
            assert (bar.value, bar.max, bar.bar_style) == (3, 8, "")
            assert widget_renderer.status.value == "3/8 engines registered (job 7 RUNNING)"
    widget_renderer.close()
    assert (widget_renderer.engines_bar.value, widget_renderer.engines_bar.bar_style) == (8, "success")
    widget_renderer.failed("stopped")
    assert widget_renderer.engines_bar.bar_style == "danger"
