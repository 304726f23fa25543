"""Keep-alive: the HTTP backends' client drops an idle connection before a server's 5 s idle close can race a
request on it, and radixflow's server keeps idle connections longer than common clients do."""

from __future__ import annotations

import http.server
import threading
import time

from radixflow.lang.backends.http_util import KEEPALIVE_EXPIRY_S, client
from radixflow.runtime.server.launch_server import KEEP_ALIVE_S


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one handler (thread) per connection, many requests on it
    connections: list = []

    def setup(self) -> None:
        super().setup()
        _Handler.connections.append(self.client_address)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_client_reuses_a_fresh_connection_and_drops_an_idle_one_before_five_seconds():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Handler.connections = []
    try:
        with client(f"http://127.0.0.1:{server.server_address[1]}", None, 10.0) as c:
            c.get("/a")
            c.get("/b")
            assert len(_Handler.connections) == 1  # reused while fresh
            time.sleep(KEEPALIVE_EXPIRY_S + 0.3)
            c.get("/c")
            assert len(_Handler.connections) == 2  # idle past the expiry: a new connection, not the stale one
    finally:
        server.shutdown()
        server.server_close()


def test_expiry_is_below_uvicorns_idle_close_and_the_server_keeps_connections_longer():
    assert KEEPALIVE_EXPIRY_S < 5 < KEEP_ALIVE_S
