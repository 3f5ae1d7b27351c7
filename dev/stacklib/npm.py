"""Tools from npm the tests need: configurable-http-proxy for the JupyterHub test."""

import shutil

from . import layout
from .proc import run, say

CHP_PREFIX = layout.CACHE / "chp"
CHP_BIN = CHP_PREFIX / "node_modules" / ".bin" / "configurable-http-proxy"


def up() -> None:
    if CHP_BIN.exists():
        return
    if shutil.which("npm") is None:
        raise SystemExit("[stack] npm is needed (node 18+): it builds the JupyterLab extension too")
    say("installing configurable-http-proxy from npm")
    CHP_PREFIX.mkdir(parents=True, exist_ok=True)
    run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(CHP_PREFIX), "configurable-http-proxy@5"])


def status() -> dict[str, bool]:
    return {"configurable-http-proxy": CHP_BIN.exists()}
