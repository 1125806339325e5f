"""Local endpoints for the tests of probes: a closed port, a silent one, a small HTTP server.
No network: everything listens on 127.0.0.1."""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
from collections.abc import Iterator


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@contextlib.contextmanager
def silent_port() -> Iterator[int]:
    """A port that takes connections (the kernel completes them into the backlog) and never
    answers, as a host behind a firewall that drops packets or a hung server does."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield s.getsockname()[1]


@contextlib.contextmanager
def http_server(status: int = 404) -> Iterator[int]:
    """An HTTP server on 127.0.0.1 answering every GET with `status`: its port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the library's name
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
