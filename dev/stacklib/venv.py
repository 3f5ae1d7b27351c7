"""The stack user's Python environment: Debian's python3 + the project, editable."""

import hashlib
import shutil

from . import layout
from .proc import run, say, succeeds

STAMP = layout.VENV / ".jph-stamp"


def _wanted_stamp() -> str:
    digest = hashlib.sha256((layout.CHECKOUT / "pyproject.toml").read_bytes())
    digest.update(str(layout.CHECKOUT).encode())
    return digest.hexdigest()


def ready() -> bool:
    return STAMP.exists() and STAMP.read_text() == _wanted_stamp()


def _usable() -> bool:
    python = layout.VENV / "bin" / "python"
    return python.exists() and succeeds([str(python), "-m", "pip", "--version"])


def up() -> None:
    if ready():
        return
    if not _usable():
        say(f"creating the virtual environment {layout.VENV}")
        shutil.rmtree(layout.VENV, ignore_errors=True)
        run(["/usr/bin/python3", "-m", "venv", str(layout.VENV)])
        run([str(layout.VENV / "bin" / "python"), "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
    else:
        say(f"updating the virtual environment {layout.VENV}")
    # In place: pip install is idempotent, so an interrupted install heals on the
    # next run; the stamp is written only after it succeeded.
    pip = [str(layout.VENV / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    run([*pip, "--editable", f"{layout.CHECKOUT}[test,docs,lint]"], cwd=layout.CHECKOUT)
    run(["chmod", "-R", "a+rX", str(layout.VENV)])
    STAMP.write_text(_wanted_stamp())


def status() -> dict[str, bool]:
    return {"venv": ready()}
