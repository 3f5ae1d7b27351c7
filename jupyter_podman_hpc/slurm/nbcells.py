"""Running a notebook's cells on a rank: as plain Python (a script's ``__main__``, with a
notebook's last-expression result) or in a batch IPython shell; what they print and display
goes to the rank's log and to rank 0's recorder (``nbrecorder``).

Part of the notebook runner (``nbrunner.py``), copied beside it into the job
directory: Python's standard library only, and IPython where the notebook
needs it (magics: ``ipython`` is ``require``) or may use it (``prefer``) and
the image has it.
"""

# The image's python3 runs this file, whatever its version: it keeps to what old ones read (no f-strings,
# annotations or :=), so its strings are %-formatted.
# ruff: noqa: UP031

import ast
import builtins
import linecache
import os
import sys
import traceback
import types

REPR_METHODS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
    ("_repr_javascript_", "application/javascript"),
)


class Tee:
    """sys.stdout/sys.stderr: everything goes to the rank's log as before, and to the recorder."""

    def __init__(self, stream, name, recorder):
        self.stream, self.name, self.recorder = stream, name, recorder

    def write(self, text):
        """Write ``text`` to the rank's log and, on rank 0, to the running cell's outputs; what the stream
        wrote."""
        written = self.stream.write(text)
        if self.recorder is not None:
            self.recorder.stream(self.name, text)
        return written

    def flush(self):
        """Flush the rank's log (the recorder writes on its own schedule)."""
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


class PlainRunner:
    """Cells as Python code, as ``python3 script.py`` would run them, with a notebook's last-expression result."""

    def __init__(self, recorder):
        self.recorder = recorder
        module = types.ModuleType("__main__")
        module.__dict__["__builtins__"] = builtins  # as in a script's __main__
        sys.modules["__main__"] = module  # pickling what the cells define works as in a script
        self.namespace = module.__dict__

    def run(self, code, index):
        """Run cell ``index`` (``code``) in the notebook's namespace, a last expression's value recorded as
        its result; None, or (name, message, traceback lines) when it raised. ``sys.exit(0)`` passes
        through."""
        filename = "<cell %d>" % (index + 1)
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        try:
            self._execute(code, filename)
        except BaseException as err:
            if isinstance(err, SystemExit) and not err.code:
                raise
            return _reported(err)
        return None

    def _execute(self, code, filename):
        tree = ast.parse(code, filename, "exec")
        last = _last_expression(tree, code)
        exec(compile(tree, filename, "exec"), self.namespace)
        if last is not None:
            self._result(eval(compile(last, filename, "eval"), self.namespace))  # noqa: S307  the cell's own code

    def _result(self, value):
        """A last expression's value: the namespace's ``_``, and the cell's result on rank 0."""
        if value is None:
            return
        self.namespace["_"] = value
        if self.recorder is not None:
            self.recorder.display(rich_repr(value), kind="execute_result")


def _last_expression(tree, code):
    """The cell's last statement taken out of ``tree`` as an expression, when it is one whose value a
    notebook shows (not ended by ``;``); else None."""
    if tree.body and isinstance(tree.body[-1], ast.Expr) and not code.rstrip().endswith(";"):
        return ast.Expression(tree.body.pop().value)
    return None


def _reported(err):
    """A cell's error, its traceback (from the cell's own frames) written to the rank's log:
    (name, message, traceback lines)."""
    lines = traceback.format_exception(type(err), err, _user_frames(err.__traceback__))
    sys.__stderr__.write("".join(lines))
    sys.__stderr__.flush()
    return type(err).__name__, str(err), [line.rstrip("\n") for line in lines]


def _user_frames(tb):
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb


def _first(found):
    """A repr method's data, without the metadata of a (data, metadata) pair."""
    return found[0] if isinstance(found, tuple) else found


def _add_mimebundle(data, value):
    """What ``value``'s ``_repr_mimebundle_`` gives, into ``data``."""
    method = getattr(value, "_repr_mimebundle_", None)
    if not callable(method):
        return
    try:
        data.update(_first(method(include=None, exclude=None)) or {})
    except Exception:  # noqa: BLE001 - a broken repr leaves text/plain
        pass


def _add_repr(data, mime, method):
    """What a ``_repr_*_`` method gives, into ``data`` as ``mime``; nothing when it fails or gives None."""
    try:
        found = method()
    except Exception:  # noqa: BLE001
        return
    found = _first(found)
    if found is not None:
        data[mime] = found


def rich_repr(value):
    """What IPython's formatters would give for ``value``, from its ``_repr_*_`` methods."""
    data = {"text/plain": repr(value)}
    if isinstance(value, type):
        return data
    _add_mimebundle(data, value)
    for name, mime in REPR_METHODS:
        method = getattr(value, name, None)
        if mime not in data and callable(method):
            _add_repr(data, mime, method)
    return data


def ipython_runner(recorder):
    """A batch IPython shell whose results, displays and errors go to the recorder (rank 0)."""
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets import Type
    from traitlets.config import Config

    class Hook(DisplayHook):
        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            if recorder is not None:
                recorder.display(format_dict, md_dict, kind="execute_result")

        def finish_displayhook(self):
            sys.stdout.flush()

    class Publisher(DisplayPublisher):
        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
            if recorder is not None:
                recorder.display(data, metadata)
            if "text/plain" in data:  # the rank's log shows it, as a script's display() did
                sys.__stdout__.write(str(data["text/plain"]) + "\n")

        def clear_output(self, wait=False):
            if recorder is not None:
                recorder.clear(wait)

    class BatchShell(InteractiveShell):
        displayhook_class = Type(Hook)
        display_pub_class = Type(Publisher)

        def _showtraceback(self, etype, evalue, stb):
            self.last_error = (etype.__name__, str(evalue), list(stb))
            sys.__stderr__.write(self.InteractiveTB.stb2text(stb) + "\n")
            sys.__stderr__.flush()

        def show_usage_error(self, exc):
            self.last_error = ("UsageError", str(exc), ["UsageError: %s" % exc])
            sys.__stderr__.write("UsageError: %s\n" % exc)

    if "MPLBACKEND" not in os.environ:
        import importlib.util

        if importlib.util.find_spec("matplotlib_inline") is not None:
            # figures are displayed at the end of each cell, as in a notebook
            os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    config = Config()
    config.HistoryManager.enabled = False
    config.InteractiveShell.colors = "NoColor"
    shell = BatchShell.instance(config=config)
    try:
        shell.InteractiveTB.set_colors("NoColor")
    except Exception:  # noqa: BLE001 - newer IPython names its themes differently
        pass

    class Runner:
        namespace = shell.user_ns

        def run(self, code, index):
            shell.last_error = None
            result = shell.run_cell(code, store_history=True)
            if result.success:
                return None
            if shell.last_error:
                return shell.last_error
            err = result.error_in_exec or result.error_before_exec
            return type(err).__name__, str(err), ["%s: %s" % (type(err).__name__, err)]

    return Runner()


def make_runner(plan, recorder):
    """The cell runner the plan asks for: IPython's when it is required or preferred and the image has it,
    else the plain one; a SystemExit (returned, not raised) when IPython is required and missing."""
    if plan.ipython in ("require", "prefer"):
        try:
            return ipython_runner(recorder)
        except ImportError as err:
            if plan.ipython == "require":
                return SystemExit(
                    "nbrunner: this notebook uses IPython magics and the image has no IPython "
                    "(%s): install ipython in the image, or submit with notebook_magics='comment'" % err
                )
    return PlainRunner(recorder)
