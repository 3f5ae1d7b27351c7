"""The registry as the pulling podman sees it, in a process of its own that a test can kill.

``python -m tests.faults.registry_front UPSTREAM PORT RATE`` serves the stack's registry
through ``SlowRegistry`` (blob bodies paced to RATE bytes per second) on 127.0.0.1:PORT and
prints ``ready``, then ``blob <path>`` as each blob's body starts, on its standard output.
SIGKILL is the registry gone mid-pull: every connection drops, new ones are refused; the
stack's own registry, which other tests use at the same time, is left alone. Started again
on the same port, the registry is back.
"""

from __future__ import annotations

import sys
import threading
from http.server import ThreadingHTTPServer

from tests.integration.engine.slow_registry import SlowRegistry


def main(argv: list[str]) -> None:
    upstream, port, rate = argv[0], int(argv[1]), int(argv[2])
    front = SlowRegistry(upstream, rate)
    front.server.server_close()  # it took any free port: this one must stay the same across restarts
    handler = front._handler()
    forward = handler.do_GET

    def do_get(request) -> None:
        if "/blobs/" in request.path:
            print(f"blob {request.path}", flush=True)
        forward(request)

    handler.do_GET = do_get
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    print("ready", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1:])
