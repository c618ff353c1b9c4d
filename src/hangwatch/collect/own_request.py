"""hangwatch's own request to a serving engine: one one-token completion, with a deadline.

The surest way to know whether a server that says it is healthy still answers is to ask it. Sent
only to the server hangwatch launched (or the URL it was given), only while serving, one at a time,
with a deadline; its outcome is evidence, and it is named in the report. The model name comes from
the server's own ``/v1/models``. ``http.client``: one short connection per call, nothing pooled.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from hangwatch.model.samples import SUCCESS_STATUSES
from hangwatch.model.samples import OwnRequest


class OwnRequester:
    def __init__(self, base_url: str, clock: Callable[[], float], timeout_s: float) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.url = f"{parts.scheme}://{parts.netloc}/v1/completions"
        self._clock = clock
        self._timeout = timeout_s
        self._lock = threading.Lock()
        self._latest: OwnRequest | None = None
        self._thread: threading.Thread | None = None
        self.sent = 0

    def ask(self) -> None:
        """Send one request now, unless one is pending."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._latest = OwnRequest(sent_t=round(self._clock(), 3), url=self.url)
            self.sent += 1
            self._thread = threading.Thread(target=self._run, name="hangwatch-own-request", daemon=True)
            self._thread.start()

    def latest(self) -> OwnRequest | None:
        with self._lock:
            return self._latest

    def _run(self) -> None:
        started = time.monotonic()
        try:
            answered, detail = self._exchange(started)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            answered, detail = False, f"{type(exc).__name__}: {exc}"[:200]
        with self._lock:
            assert self._latest is not None
            self._latest = OwnRequest(
                self._latest.sent_t, self.url, round(self._clock(), 3), answered, detail
            )

    def _exchange(self, started: float) -> tuple[bool, str]:
        model = self._call("GET", "/v1/models", None, started)
        if model[0] != 200:
            return False, f"GET /v1/models answered HTTP {model[0]}"
        data = json.loads(model[1] or b"{}").get("data") or [{}]
        body = {"model": data[0].get("id", ""), "prompt": "Hello", "max_tokens": 1, "temperature": 0}
        status, _ = self._call("POST", "/v1/completions", json.dumps(body).encode(), started)
        elapsed = time.monotonic() - started
        if status in SUCCESS_STATUSES:
            return True, f"HTTP {status} in {elapsed:.2f} s"
        return False, f"HTTP {status} after {elapsed:.1f} s"

    def _call(self, method: str, path: str, body: bytes | None, started: float) -> tuple[int, bytes]:
        left = max(0.5, self._timeout - (time.monotonic() - started))
        conn = http.client.HTTPConnection(self.host, self.port, timeout=left)
        try:
            conn.connect()
            headers = {"User-Agent": "hangwatch-own-request", "Content-Type": "application/json"}
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read(1 << 20)
        except TimeoutError:
            raise TimeoutError(f"no answer within {self._timeout:g} s") from None
        finally:
            conn.close()
