"""Every probe outcome, against real sockets on loopback."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from hangwatch.collect.http_probe import probe_once
from hangwatch.model.samples import ProbeOutcome
from proc_helpers import free_port


@contextmanager
def tcp_server(behaviour: str) -> Iterator[int]:
    """'silent': accept and never answer; 'garbage': answer with something that is not HTTP."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            held.append(conn)
            if behaviour == "garbage":
                conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for c in held:
            c.close()
        srv.close()


def test_refused_when_nothing_listens():
    r = probe_once(f"http://127.0.0.1:{free_port()}/health", 1.0)
    assert r.outcome is ProbeOutcome.REFUSED and "refused" in (r.detail or "")


def test_timeout_when_connected_but_never_answered():
    with tcp_server("silent") as port:
        r = probe_once(f"http://127.0.0.1:{port}/health", 0.5)
    assert r.outcome is ProbeOutcome.TIMEOUT and "no HTTP answer" in (r.detail or "")


def test_error_when_not_http():
    with tcp_server("garbage") as port:
        r = probe_once(f"http://127.0.0.1:{port}/health", 1.0)
    assert r.outcome is ProbeOutcome.ERROR and "not an HTTP answer" in (r.detail or "")


def test_http_status_is_recorded():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(503 if self.path == "/health" else 200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        ports: list[int] = []
        r = probe_once(f"http://127.0.0.1:{server.server_port}/health", 1.0, on_connect=ports.append)
        assert r.outcome is ProbeOutcome.HTTP and r.status == 503 and r.describe() == "HTTP 503"
        assert ports and ports[0] != server.server_port  # our source port, to recognise echoes in logs
    finally:
        server.shutdown()
        server.server_close()


def test_a_probe_is_green_only_on_an_http_2xx():
    from hangwatch.model.samples import ProbeOutcome
    from hangwatch.model.samples import ProbeResult

    assert (
        ProbeResult(0, "u", ProbeOutcome.HTTP, 200).green
        and ProbeResult(0, "u", ProbeOutcome.HTTP, 204).green
    )
    assert not ProbeResult(0, "u", ProbeOutcome.HTTP, 503).green
    assert (
        not ProbeResult(0, "u", ProbeOutcome.HTTP, 302).green
        and not ProbeResult(0, "u", ProbeOutcome.HTTP).green
    )
    assert not ProbeResult(0, "u", ProbeOutcome.REFUSED).green
