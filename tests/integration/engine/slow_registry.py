"""A bandwidth-limited HTTP proxy in front of the stack's registry.

podman reports a layer's download progress once a second; over loopback a
layer of a few MB arrives faster than that. To see byte progress without
pushing huge images, tests pull through this proxy, which forwards every
request to the registry and paces blob bodies to ``rate`` bytes per second
per connection. It listens on 127.0.0.1 only.
"""

from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
}


class SlowRegistry:
    def __init__(self, upstream: str, rate: int):
        host, _, port = upstream.partition(":")
        self.upstream = (host, int(port or 80))
        self.rate = rate
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host}:{port}"

    def __enter__(self) -> SlowRegistry:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def registries_conf(self, directory: str | Path) -> Path:
        """A registries.conf (the system's, plus the proxy as a plain-HTTP registry) for
        ``CONTAINERS_REGISTRIES_CONF``; the system's drop-in directory still applies."""
        system = Path("/etc/containers/registries.conf")
        text = system.read_text() if system.exists() else ""
        path = Path(directory) / "registries.conf"
        path.write_text(f'{text}\n[[registry]]\nlocation = "{self.address}"\ninsecure = true\n')
        return path

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self._forward(body=False)

            def do_GET(self):
                self._forward(body=True)

            def _forward(self, body: bool) -> None:
                upstream = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                upstream.putrequest(self.command, self.path, skip_accept_encoding=True)
                for key, value in self.headers.items():  # repeated headers (Accept) stay repeated
                    if key.lower() not in HOP_BY_HOP | {"host"}:
                        upstream.putheader(key, value)
                upstream.endheaders()
                reply = upstream.getresponse()
                data_length = reply.getheader("Content-Length")
                self.send_response(reply.status, reply.reason)
                for key, value in reply.getheaders():
                    if key.lower() not in HOP_BY_HOP:
                        self.send_header(key, value)
                if data_length is None and body:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                if body:
                    slow = "/blobs/" in self.path
                    chunk = max(4096, proxy.rate // 20) if slow else 65536
                    started, sent = time.monotonic(), 0
                    while data := reply.read(chunk):
                        self.wfile.write(data)
                        sent += len(data)
                        if slow:
                            ahead = sent / proxy.rate - (time.monotonic() - started)
                            if ahead > 0:
                                time.sleep(ahead)
                upstream.close()

        return Handler
