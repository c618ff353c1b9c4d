"""The sidecar's HTTP endpoints: the one boundary where orchestrators and Prometheus read hangwatch.

Every answer comes from the latest reading (``Health``, replaced whole by the watch loop), so none ever
waits on a tick, a stack capture or a lock: a probe's timeout can be short. Served by the standard
library's threading server, one thread a connection, on the address given (loopback by default; a pod's
probes need ``--listen 0.0.0.0:PORT``).

    /startup  /live  /ready   200 or 503, one line of text: why
    /verdict                  the reading and the standing verdict, JSON (schema hangwatch.health/1)
    /metrics                  Prometheus text
    /dump (POST, or GET for a preStop httpGet hook)
                              the whole report written to the evidence folder now; its path, one line
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer
from urllib.parse import urlsplit

from hangwatch.analyse.health import answer
from hangwatch.model.health import Health
from hangwatch.model.health import ProbeKind
from hangwatch.redact import scrub
from hangwatch.render.json_report import json_text
from hangwatch.render.json_report import report_to_dict
from hangwatch.render.metrics_text import CONTENT_TYPE
from hangwatch.render.metrics_text import metrics_text

HEALTH_SCHEMA = "hangwatch.health/1"
PATHS: dict[str, ProbeKind] = {
    "/startup": ProbeKind.STARTUP,
    "/live": ProbeKind.LIVENESS,
    "/livez": ProbeKind.LIVENESS,
    "/ready": ProbeKind.READINESS,
    "/readyz": ProbeKind.READINESS,
}
INDEX = "hangwatch sidecar: /startup /live /ready /verdict /metrics /dump\n"
# How long a dump request waits for the loop: a tick (1 s), a capture of a large tree (2-3 s) and the write.
DUMP_WAIT_S = 15.0


class HealthBoard:
    """The latest reading, swapped whole (one reference: readers never see half a reading), and the desk
    where a dump is asked for: the loop's own thread writes it (the analysis is not shared across
    threads), the asking thread waits for the answer."""

    def __init__(self) -> None:
        self._health: Health | None = None
        self._lock = threading.Lock()  # one dump at a time
        self._asked = threading.Event()
        self._done = threading.Event()
        self._answer = ""

    def set(self, health: Health) -> None:
        self._health = health

    def get(self) -> Health | None:
        return self._health

    def ask_dump(self, timeout_s: float) -> str | None:
        """The loop's answer (the report's path, or why not), None when no loop took it in time."""
        with self._lock:
            self._done.clear()
            self._asked.set()
            answered = self._done.wait(timeout_s)
            self._asked.clear()
            return self._answer if answered else None

    def dump_asked(self) -> bool:
        return self._asked.is_set()

    def dumped(self, answer: str) -> None:
        self._answer = answer
        self._asked.clear()
        self._done.set()


def _handler(board: HealthBoard, wall: Callable[[], float]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "hangwatch"

        def do_GET(self) -> None:
            path = urlsplit(self.path).path.rstrip("/") or "/"
            health = board.get()
            if path in PATHS:
                said = answer(PATHS[path], health, wall())
                self._send(said.status, "text/plain; charset=utf-8", f"{scrub(said.reason)}\n")
            elif path == "/metrics":
                self._send(200, CONTENT_TYPE, metrics_text(health, wall()))
            elif path == "/verdict":
                data = {"schema": HEALTH_SCHEMA, "health": report_to_dict(health) if health else None}
                self._send(200, "application/json", json_text(data))
            elif path == "/dump":
                self._dump()
            elif path == "/":
                self._send(200, "text/plain; charset=utf-8", INDEX)
            else:
                self._send(404, "text/plain; charset=utf-8", f"no such endpoint: {path}\n{INDEX}")

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_POST(self) -> None:
            if urlsplit(self.path).path.rstrip("/") == "/dump":
                self._dump()
            else:
                self._send(404, "text/plain; charset=utf-8", "only /dump takes a POST\n")

        def _dump(self) -> None:
            said = board.ask_dump(DUMP_WAIT_S)
            if said is None:
                self._send(
                    503, "text/plain; charset=utf-8", "no watch running to dump (none yet, or it ended)\n"
                )
            else:
                self._send(200 if said.startswith("/") else 500, "text/plain; charset=utf-8", f"{said}\n")

        def _send(self, status: int, kind: str, text: str) -> None:
            body = text.encode("utf-8", "replace")
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # a probe every few seconds is not news

    return Handler


class HealthServer:
    """The endpoints over ``board``, served from a daemon thread until ``close``."""

    def __init__(
        self, host: str, port: int, board: HealthBoard, wall: Callable[[], float] = time.time
    ) -> None:
        self._server = ThreadingHTTPServer((host, port), _handler(board, wall))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="hangwatch-sidecar", daemon=True
        )

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
