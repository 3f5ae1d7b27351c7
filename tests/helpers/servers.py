"""Jupyter servers run as processes and reached as a user does: a free port, waiting for an URL,
a `jupyter server` in a kernel site's environment, JSON requests with a token, and a kernel
started over REST and run over its WebSocket."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.helpers.kernel_site import BIN


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(
    url: str,
    timeout: float,
    process: subprocess.Popen | None = None,
    log: Path | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    """Until ``url`` answers 200 (a proxy's 404 before its backend is up does not count)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if process is not None and process.poll() is not None:
            text = log.read_text()[-4000:] if log and log.exists() else ""
            pytest.fail(f"the server exited with {process.returncode} before answering {url}\n{text}")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:  # refused, or an HTTPError
            pass
        time.sleep(0.2)
    text = log.read_text()[-4000:] if log and log.exists() else ""
    pytest.fail(f"{url} did not answer within {timeout} s\n{text}")


def stop(process: subprocess.Popen, timeout: float = 20) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def processes_mentioning(text: str) -> list[int]:
    """Our processes whose command line contains ``text`` (e.g. a container name)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def http(method: str, url: str, token: str, body: dict | None = None, timeout: float = 120) -> tuple[int, dict]:
    """One JSON request with token auth; (status, decoded body or {})."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Authorization": f"token {token}", "Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read()
            status = response.status
    except urllib.error.HTTPError as err:
        text, status = err.read(), err.code
    try:
        return status, json.loads(text) if text else {}
    except ValueError:
        return status, {"raw": text.decode(errors="replace")}


@contextlib.contextmanager
def jupyter_server(site, root: Path, log_path: Path):
    """`jupyter server` on 127.0.0.1 with a token, in the kernel site's environment, its output appended
    to ``log_path``: (base URL, token, process)."""
    port, token = free_port(), secrets.token_hex(16)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [
                str(BIN / "jupyter-server"),
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={port}",
                "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={token}",
                "--ServerApp.open_browser=False",
                f"--ServerApp.root_dir={root}",
            ],
            env=site.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_http(f"{base}/api/status", 90, process, log_path, {"Authorization": f"token {token}"})
            yield base, token, process
        finally:
            stop(process)


async def execute_over_websocket(url: str, token: str, code: str, timeout: float = 60) -> tuple[dict, str]:
    """Send an execute_request on a kernel's /channels WebSocket; (the reply's content, stdout text)."""
    import asyncio
    import datetime

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    connection = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {token}"}))
    try:
        msg_id = uuid.uuid4().hex
        session = uuid.uuid4().hex
        connection.write_message(
            json.dumps(
                {
                    "header": {
                        "msg_id": msg_id,
                        "username": "test",
                        "session": session,
                        "msg_type": "execute_request",
                        "version": "5.3",
                        "date": datetime.datetime.now(datetime.UTC).isoformat(),
                    },
                    "parent_header": {},
                    "metadata": {},
                    "channel": "shell",
                    "buffers": [],
                    "content": {
                        "code": code,
                        "silent": False,
                        "store_history": False,
                        "user_expressions": {},
                        "allow_stdin": False,
                        "stop_on_error": True,
                    },
                }
            )
        )
        out: list[str] = []
        reply: dict | None = None
        idle = False
        deadline = asyncio.get_running_loop().time() + timeout
        while reply is None or not idle:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise TimeoutError(f"no execute_reply within {timeout} s (stdout so far: {''.join(out)!r})")
            raw = await asyncio.wait_for(connection.read_message(), remaining)
            if raw is None:
                raise ConnectionError("the kernel's WebSocket closed")
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["header"]["msg_type"]
            if kind == "stream" and msg["content"].get("name") == "stdout":
                out.append(msg["content"]["text"])
            elif kind == "execute_reply":
                reply = msg["content"]
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                idle = True
        return reply, "".join(out)
    finally:
        connection.close()


def start_kernel(server_url: str, token: str, name: str, log: Path | None = None) -> str:
    """Start kernel ``name`` through a Jupyter server's REST API (``server_url``: a server's, or a
    hub user's); its id. Should it fail, the tail of ``log`` (the server's or hub's) says why."""
    status, kernel = http("POST", f"{server_url}/api/kernels", token, {"name": name})
    assert status == 201, f"{kernel}\n{log.read_text(errors='replace')[-4000:] if log else ''}"
    return kernel["id"]


def run_cell(server_url: str, token: str, kernel_id: str, code: str) -> str:
    """Run ``code`` in a kernel of a Jupyter server over its WebSocket, as a notebook does; its
    stdout, once it ran without error."""
    ws_url = server_url.replace("http://", "ws://", 1) + f"/api/kernels/{kernel_id}/channels"
    reply, out = asyncio.run(execute_over_websocket(ws_url, token, code))
    assert reply["status"] == "ok", reply
    return out
