"""A real IPython kernel (ipykernel, started with jupyter_client) with the magics loaded.

`KernelSession.execute` runs a cell and collects what a front end would see:
the reply, the outputs (stream, display_data, execute_result, error) and the
widget comm traffic. `allow_stdin` chooses how the magics render: a request
that allows stdin is what JupyterLab sends (widgets), one that does not is
what nbclient and nbval send (text).
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_client.manager import KernelManager

from tests.helpers.hpc import Hpc

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


@dataclass
class Cell:
    code: str
    reply: dict
    outputs: list[dict] = field(default_factory=list)  # {"msg_type", "content", "time"}
    comms: list[dict] = field(default_factory=list)  # comm_open / comm_msg of the cell
    started: float = 0.0
    ended: float = 0.0

    @property
    def ok(self) -> bool:
        return self.reply.get("status") == "ok"

    def stream(self, name: str) -> str:
        return "".join(
            o["content"]["text"] for o in self.outputs if o["msg_type"] == "stream" and o["content"]["name"] == name
        )

    @property
    def stdout(self) -> str:
        return self.stream("stdout")

    @property
    def stderr(self) -> str:
        return self.stream("stderr")

    @property
    def error(self) -> dict | None:
        return next((o["content"] for o in self.outputs if o["msg_type"] == "error"), None)

    @property
    def error_text(self) -> str:
        error = self.error
        return "\n".join(error["traceback"]) if error else ""

    def data(self, mime: str) -> list:
        return [
            o["content"]["data"][mime]
            for o in self.outputs
            if o["msg_type"] in ("display_data", "execute_result") and mime in o["content"]["data"]
        ]

    @property
    def result(self) -> dict | None:
        return next((o["content"]["data"] for o in self.outputs if o["msg_type"] == "execute_result"), None)

    def text(self) -> str:
        """Everything a person reads in the cell's output area, as text."""
        parts = []
        for o in self.outputs:
            content = o["content"]
            if o["msg_type"] == "stream":
                parts.append(content["text"])
            elif o["msg_type"] in ("display_data", "execute_result"):
                parts.append(content["data"].get("text/plain", "") + "\n")
            elif o["msg_type"] == "error":
                parts.append("\n".join(content["traceback"]) + "\n")
        return "".join(parts)

    def show(self) -> str:
        return f"--- {self.code!r}\nreply: {self.reply.get('status')}\n{self.text()}"


class KernelSession:
    """One ipykernel with `%load_ext jupyter_podman_hpc` done."""

    def __init__(self, env: dict[str, str], cwd: Path):
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(env=env, cwd=str(cwd))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)
        self.comms: list[dict] = []  # every comm message seen, in order
        cell = self.execute("%load_ext jupyter_podman_hpc")
        assert cell.ok, cell.show()

    def _record(self, msg: dict, cell: Cell | None) -> None:
        kind = msg["header"]["msg_type"]
        entry = {
            "msg_type": kind,
            "content": msg["content"],
            "time": time.monotonic(),
            "parent": msg.get("parent_header", {}).get("msg_id"),
        }
        if kind in ("comm_open", "comm_msg", "comm_close"):
            self.comms.append(entry)
            if cell is not None:
                cell.comms.append(entry)
        elif cell is not None and kind in ("stream", "display_data", "execute_result", "error", "update_display_data"):
            cell.outputs.append(entry)

    def execute(self, code: str, *, allow_stdin: bool = False, timeout: float = 600) -> Cell:
        cell = Cell(code, {}, started=time.monotonic())
        msg_id = self.kc.execute(code, allow_stdin=allow_stdin, stop_on_error=False)
        deadline = time.monotonic() + timeout
        idle = False
        while not idle:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no idle status within {timeout} s\n{cell.show()}")
            try:
                msg = self.kc.get_iopub_msg(timeout=min(remaining, 5))
            except queue.Empty:
                continue
            mine = msg.get("parent_header", {}).get("msg_id") == msg_id
            if mine and msg["header"]["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                idle = True
                continue
            self._record(msg, cell if mine else None)
        cell.ended = time.monotonic()
        while not cell.reply:
            reply = self.kc.get_shell_msg(timeout=max(1, deadline - time.monotonic()))
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                cell.reply = reply["content"]
        return cell

    def listen(self, seconds: float, until=None) -> None:
        """Record iopub traffic while the kernel is idle (widget updates from threads)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                continue
            self._record(msg, None)
            if until is not None and until(self):
                return

    def widget_states(self) -> dict[str, dict]:
        """comm id -> the widget model's state, as the front end would have it now."""
        states: dict[str, dict] = {}
        for entry in self.comms:
            content = entry["content"]
            if entry["msg_type"] == "comm_open" and content.get("target_name") == "jupyter.widget":
                states[content["comm_id"]] = dict(content["data"].get("state", {}))
            elif entry["msg_type"] == "comm_msg" and content["comm_id"] in states:
                data = content.get("data", {})
                if data.get("method") in ("update", "echo_update"):
                    states[content["comm_id"]].update(data.get("state", {}))
        return states

    def updates(self, comm_id: str) -> list[dict]:
        """The state updates sent to one widget, in order, with their times."""
        return [
            {**e["content"]["data"].get("state", {}), "_time": e["time"]}
            for e in self.comms
            if e["msg_type"] == "comm_msg"
            and e["content"]["comm_id"] == comm_id
            and e["content"].get("data", {}).get("method") == "update"
        ]

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def kernel_env(hpc: Hpc, root: Path) -> dict[str, str]:
    """The engine environment of an Hpc fixture, SCRATCH (the jobs root) and Jupyter's directories
    in the test's own directory."""
    env = dict(hpc.env)
    env.pop("PODMAN_HPC_WIDGETS", None)
    env.update(
        {
            "SCRATCH": str(hpc.work / "scratch"),
            "JUPYTER_DATA_DIR": str(root / "data"),
            "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
            "JUPYTER_CONFIG_DIR": str(root / "config"),
            "JUPYTER_PATH": str(root / "data"),
            "JUPYTER_PLATFORM_DIRS": "0",
            "IPYTHONDIR": str(root / "ipython"),
        }
    )
    (hpc.work / "scratch").mkdir(exist_ok=True)
    return env


def start_session(hpc: Hpc, root: Path, **extra: str) -> KernelSession:
    root.mkdir(parents=True, exist_ok=True)
    env = {**kernel_env(hpc, root), **extra}
    return KernelSession(env, root)


# Open MPI inside the stack's containers talks over loopback and TCP only.
MPI_ENV = "--env OMPI_MCA_btl=self,tcp --env OMPI_MCA_btl_tcp_if_include=lo --env OMPI_MCA_oob_tcp_if_include=lo"


def short_error(cell) -> str:
    """The error a cell shows: one short message, no traceback."""
    assert not cell.ok, cell.show()
    text = cell.error_text
    assert text.startswith("podman-hpc: error: "), cell.show()
    assert "Traceback" not in text and "File " not in text and "\x1b[" not in text, cell.show()
    return text
