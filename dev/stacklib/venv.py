"""The stack user's Python environment: Debian's python3 + the project, editable."""

import hashlib
import shutil

from . import layout
from .proc import run, say

STAMP = layout.VENV / ".jph-stamp"


def _wanted_stamp() -> str:
    digest = hashlib.sha256((layout.CHECKOUT / "pyproject.toml").read_bytes())
    digest.update(str(layout.CHECKOUT).encode())
    return digest.hexdigest()


def ready() -> bool:
    return STAMP.exists() and STAMP.read_text() == _wanted_stamp()


def up() -> None:
    if ready():
        return
    say(f"creating the virtual environment {layout.VENV}")
    # Rebuilt from scratch: a half-installed environment is never reused.
    shutil.rmtree(layout.VENV, ignore_errors=True)
    run(["/usr/bin/python3", "-m", "venv", str(layout.VENV)])
    pip = [str(layout.VENV / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    run([*pip, "--upgrade", "pip"])
    run([*pip, "--editable", f"{layout.CHECKOUT}[test]"], cwd=layout.CHECKOUT)
    run(["chmod", "-R", "a+rX", str(layout.VENV)])
    STAMP.write_text(_wanted_stamp())


def status() -> dict[str, bool]:
    return {"venv": ready()}
