"""Tables the magics return, errors shown without a traceback, and the magics in a plain IPython shell."""

import pytest
from IPython.core.interactiveshell import InteractiveShell

from jupyter_podman_hpc.engine.images.catalog import ImageInfo
from jupyter_podman_hpc.engine.text import text_table
from jupyter_podman_hpc.magics.core import MagicError
from jupyter_podman_hpc.magics.display import ImageList, KernelList

IMAGES = ImageList(
    [
        ImageInfo(
            id="a" * 64,
            names=["localhost/one:1", "localhost/one:latest"],
            size=12_345_678,
            created="2026-11-30T20:27:12+00:00",
            local=True,
            squashed=True,
        ),
        ImageInfo(id="b" * 64, names=[], size=999, created="2026-11-29T10:00:00+00:00", local=True, squashed=False),
    ]
)


def test_images_as_text_html_and_records():
    text = text_table(IMAGES.rows()).splitlines()
    assert text == [
        "REPOSITORY:TAG        IMAGE ID      CREATED              SIZE     SQUASHED  STORE",
        "localhost/one:1       aaaaaaaaaaaa  2026-11-30 20:27:12  12.3 MB  yes       local + squashed",
        "localhost/one:latest  aaaaaaaaaaaa  2026-11-30 20:27:12  12.3 MB  yes       local + squashed",
        "<none>                bbbbbbbbbbbb  2026-11-29 10:00:00  999 B    no        local",
    ]
    html = IMAGES._repr_html_()
    assert html.startswith("<table><thead><tr><th style='text-align:left'>REPOSITORY:TAG</th>")
    assert html.count("<tr>") == 4 and "&lt;none&gt;" in html
    assert IMAGES.records()[0]["stores"] == "local + squashed" and IMAGES.records()[1]["short_id"] == "b" * 12
    assert IMAGES.named("one:latest") is IMAGES[0] and IMAGES.named("two") is None
    assert isinstance(IMAGES, list) and IMAGES[1].size == 999


def test_empty_tables():
    assert ImageList()._repr_html_() == "<p>no images</p>"
    assert KernelList()._repr_html_() == "<p>no podman-hpc kernels</p>"


def test_a_magic_error_renders_as_its_message():
    error = MagicError("unrecognized arguments: --x", "usage: %podman_hpc images [TEXT]")
    assert error._render_traceback_() == [
        "podman-hpc: error: unrecognized arguments: --x",
        "",
        "usage: %podman_hpc images [TEXT]",
    ]


@pytest.fixture(scope="module")
def shell():
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "jupyter_podman_hpc")
    return shell


def test_help_and_errors_in_a_plain_shell(shell, capsys):
    result = shell.run_cell("%podman_hpc help images")
    assert result.success and capsys.readouterr().out.startswith("usage: %podman_hpc images [TEXT]")
    result = shell.run_cell("%podman_hpc images --bogus")
    assert isinstance(result.error_in_exec, MagicError)
    out = capsys.readouterr().out
    assert "podman-hpc: error: unrecognized arguments: --bogus" in out and "Traceback" not in out
    result = shell.run_cell("%podman_hpc submit --nodes 0 img true")
    assert isinstance(result.error_in_exec, MagicError)
    assert "podman-hpc: error: nodes must be between 1 and 100000, not 0" in capsys.readouterr().out
    result = shell.run_cell("%%podman_hpc images\nsomething\n")
    assert "images takes no cell body (only build does)" in capsys.readouterr().out


# The parser's and the job spec's refusals, as a user sees them (no kernel, no stack needed);
# tests/integration/magics/test_magics.py keeps the ones that need the stack.
PLAIN_BAD = {
    "not a number": ("%podman_hpc submit --nodes four img true", "argument -N/--nodes: 'four' is not a whole number"),
    "unknown subcommand": ("%podman_hpc frobnicate", "unknown command 'frobnicate'\n\n%podman_hpc COMMAND"),
    "bad time": ("%podman_hpc submit --time soon img true", "time 'soon' is not a Slurm time limit"),
    "no Containerfile": ("%podman_hpc build -t localhost/x:1", "build needs a Containerfile"),
    "unclosed quote": ("%podman_hpc run img echo 'oops", "cannot split the line into words"),
}


@pytest.mark.parametrize("case", sorted(PLAIN_BAD))
def test_bad_input_gives_a_message_not_a_traceback(shell, capsys, case):
    code, expected = PLAIN_BAD[case]
    result = shell.run_cell(code)
    assert isinstance(result.error_in_exec, MagicError)
    out = capsys.readouterr().out
    assert out.startswith("podman-hpc: error: ") and expected in out and "Traceback" not in out, out
