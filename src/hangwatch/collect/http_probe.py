"""The HTTP boundary for readiness probes: every probe ends in exactly one recorded outcome.

``refused`` (nothing listens), ``timeout`` (connect or answer too slow: a server that accepts
but never answers ends here), ``http`` with the status, or ``error`` with the reason. Never
silent, unlike ``curl -s``. Uses the standard library so the outcome is the socket's own errno.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import http.client
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from urllib.parse import urlsplit

from hangwatch.errors import UsageError
from hangwatch.model.samples import ProbeMarks
from hangwatch.model.samples import ProbeOutcome
from hangwatch.model.samples import ProbeResult
from hangwatch.redact import redact_url


def validate_probe_url(url: str, flag: str | None = None) -> str:
    """``url`` when a probe can use it; UsageError otherwise (before anything starts: a URL urllib cannot
    split, or a port out of range, would otherwise kill the probe thread and leave the run without one)."""
    shown = redact_url(url)
    what = f"{flag} {shown}" if flag else f"the probe URL {shown!r}"
    example = "give a URL like http://127.0.0.1:8000/health"
    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a port that is not a number from 0 to 65535
    except ValueError as exc:
        raise UsageError(f"{what}: not a valid URL ({exc}): {example}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{what}: not an HTTP URL: {example} (scheme http or https, with a host)")
    if port == 0:
        raise UsageError(f"{what}: port 0 is no port a server listens on: {example}")
    return url


def probe_once(
    url: str,
    timeout_s: float,
    t: float = 0.0,
    on_connect: Callable[[int], None] | None = None,
    on_unanswered: Callable[[socket.socket, float], None] | None = None,
) -> ProbeResult:
    """One probe. ``on_unanswered(sock, started)``: the connection of a request that got no answer in
    time is handed over open (with the monotonic time it was sent), not closed, so that its late
    answer can still be seen."""
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
            if on_unanswered is not None and conn.sock is not None:
                sock, conn.sock = conn.sock, None  # conn.close() below leaves it open
                on_unanswered(sock, started)
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
# Requests that timed out, followed at once to their late answer (each for PATIENT_TIMEOUT_S at most).
MAX_FOLLOWED = 8
_STATUS_LINE = re.compile(rb"^HTTP/\d(?:\.\d)? (\d{3})")


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
        self._late: list[ProbeResult] = []  # late answers to requests that had timed out
        self._following: set[socket.socket] = set()
        self._sends: deque[float] = deque(maxlen=32)  # when each recent probe was sent (its ``t``)

    def marks(self) -> ProbeMarks:
        """What our probes leave in the server's log, as of now (the late answers since the last call)."""
        return ProbeMarks(self.echo_markers(), self.sends(), self.late_answers())

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

    def sends(self) -> tuple[float, ...]:
        """When the recent probes were sent, the one still in flight included (it has no result yet):
        a line the server logs as it starts on a probe comes long before a slow probe's answer."""
        with self._lock:
            return tuple(self._sends)

    def late_answers(self) -> tuple[ProbeResult, ...]:
        """The answers that came after their probe had timed out, since the last call.

        Not probe outcomes (the probe said ``timeout``), but the moments the server answered us: a line
        it logs with such an answer (SGLang's ``Health check failed`` 20 s after the request) is an
        echo of our probe like any other (echoes.py), not the server's own news.
        """
        with self._lock:
            late, self._late = self._late, []
        return tuple(late)

    def _follow(self, sock: socket.socket, started: float, t: float) -> None:
        with self._lock:
            if len(self._following) >= MAX_FOLLOWED or self._stop.is_set():
                sock.close()
                return
            self._following.add(sock)
        threading.Thread(
            target=self._await_late, args=(sock, started, t), name="hangwatch-probe-late", daemon=True
        ).start()

    def _await_late(self, sock: socket.socket, started: float, t: float) -> None:
        try:
            left = PATIENT_TIMEOUT_S - (time.monotonic() - started)
            if left <= 0 or self._stop.is_set():
                return
            sock.settimeout(left)
            head = sock.recv(64)
            if not head:
                return
            elapsed = round(time.monotonic() - started, 4)
            m = _STATUS_LINE.match(head)
            status = int(m.group(1)) if m else None
            late = ProbeResult(
                t,
                redact_url(self.url),
                ProbeOutcome.HTTP,
                status,
                f"answered late, after {elapsed:.1f} s",
                elapsed,
            )
            with self._lock:
                self._late.append(late)
        except OSError:
            return
        finally:
            with self._lock:
                self._following.discard(sock)
            sock.close()

    def _loop(self) -> None:
        timeout = self._timeout
        while not self._stop.is_set():
            started = time.monotonic()
            t = round(self._clock(), 3)
            with self._lock:
                self._sends.append(t)
            outcome = probe_once(
                self.url, timeout, t, self._remember_port, functools.partial(self._follow, t=t)
            )
            with self._lock:
                self._results.append(outcome)
            # A server that takes long to answer (SGLang's /health runs a generation, and answers 503
            # after 20 s while its scheduler is wedged) gets a patient probe: its late answer, and the
            # line it logs with it, then arrive at the probe's answer, where they are told for echoes.
            # The requests that timed out on the way there are followed to their late answers.
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
        with self._lock:
            following = list(self._following)
        for sock in following:  # wakes a follower blocked in recv (close alone may not)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread.is_alive():
            self._thread.join(timeout=self._timeout + 1)
