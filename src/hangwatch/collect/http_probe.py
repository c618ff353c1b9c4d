"""The HTTP boundary for readiness probes: every probe ends in exactly one recorded outcome.

``refused`` (nothing listens), ``timeout`` (connect or answer too slow: a server that accepts
but never answers ends here), ``http`` with the status, or ``error`` with the reason. Never
silent, unlike ``curl -s``. Uses the standard library so the outcome is the socket's own errno.
"""

from __future__ import annotations

import errno
import http.client
import threading
import time
from collections import deque
from collections.abc import Callable
from urllib.parse import urlsplit

from hangwatch.errors import UsageError
from hangwatch.model.samples import ProbeOutcome
from hangwatch.model.samples import ProbeResult
from hangwatch.redact import redact_url


def validate_probe_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(
            f"the probe URL {redact_url(url)!r} is not an HTTP URL",
            "Give a URL like http://127.0.0.1:8000/health (scheme http or https, with a host).",
        )
    return url


def probe_once(
    url: str, timeout_s: float, t: float = 0.0, on_connect: Callable[[int], None] | None = None
) -> ProbeResult:
    parts = urlsplit(url)
    shown = redact_url(url)
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    started = time.monotonic()

    def result(outcome: ProbeOutcome, status: int | None = None, detail: str | None = None) -> ProbeResult:
        return ProbeResult(t, shown, outcome, status, detail, round(time.monotonic() - started, 4))

    conn = conn_cls(parts.hostname or "", parts.port, timeout=timeout_s)
    try:
        try:
            conn.connect()
        except ConnectionRefusedError:
            return result(ProbeOutcome.REFUSED, detail="connection refused: nothing listens on the port")
        except TimeoutError:
            return result(ProbeOutcome.TIMEOUT, detail=f"no TCP connection within {timeout_s:g} s")
        except OSError as exc:
            if exc.errno == errno.ECONNREFUSED:
                return result(ProbeOutcome.REFUSED, detail="connection refused: nothing listens on the port")
            return result(ProbeOutcome.ERROR, detail=f"connect failed: {exc.strerror or exc}")
        if on_connect is not None and conn.sock is not None:
            on_connect(conn.sock.getsockname()[1])
        try:
            conn.request("GET", path, headers={"User-Agent": "hangwatch-probe"})
            response = conn.getresponse()
            response.read(65536)
            return result(ProbeOutcome.HTTP, status=response.status)
        except TimeoutError:
            return result(
                ProbeOutcome.TIMEOUT, detail=f"connected, but no HTTP answer within {timeout_s:g} s"
            )
        except (http.client.HTTPException, ConnectionError) as exc:
            return result(ProbeOutcome.ERROR, detail=f"not an HTTP answer: {type(exc).__name__}: {exc}")
        except OSError as exc:
            return result(ProbeOutcome.ERROR, detail=f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


PATIENT_TIMEOUT_S = 30.0


class Prober:
    """Probes one URL in a thread at a fixed interval; the loop collects results without waiting."""

    def __init__(self, url: str, clock: Callable[[], float], interval_s: float = 1.0, timeout_s: float = 2.0):
        self.url = url
        self._clock = clock
        self._interval = interval_s
        self._timeout = timeout_s
        self._lock = threading.Lock()
        self._results: list[ProbeResult] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hangwatch-probe", daemon=True)
        self._local_ports: deque[int] = deque(maxlen=8)
        self.path = urlsplit(url).path or "/"

    def echo_markers(self) -> tuple[str, ...]:
        """Text by which a log line shows it was caused by our probe: our source ports, our request."""
        with self._lock:
            ports = tuple(self._local_ports)
        return (f'"GET {self.path} HTTP', *(f":{port}" for port in ports))

    def _remember_port(self, port: int) -> None:
        with self._lock:
            self._local_ports.append(port)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        timeout = self._timeout
        while not self._stop.is_set():
            started = time.monotonic()
            outcome = probe_once(self.url, timeout, round(self._clock(), 3), self._remember_port)
            with self._lock:
                self._results.append(outcome)
            # A server that takes long to answer (SGLang's /health runs a generation, and answers 503
            # after 20 s while its scheduler is wedged) gets a patient probe: its late answer, and the
            # line it logs with it, then arrive at the probe's answer, where they are told for echoes.
            timeout = (
                min(timeout * 2, PATIENT_TIMEOUT_S)
                if outcome.outcome is ProbeOutcome.TIMEOUT
                else self._timeout
            )
            self._stop.wait(max(0.0, self._interval - (time.monotonic() - started)))

    def drain(self) -> tuple[ProbeResult, ...]:
        with self._lock:
            results, self._results = self._results, []
        return tuple(results)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._timeout + 1)
