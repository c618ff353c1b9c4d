"""``hangwatch probe`` and ``hangwatch dump``: the sidecar's clients, for exec probes and preStop hooks.

It asks the sidecar's endpoint and exits 0 when it passes, 1 when it fails; its output is one line under
``OUTPUT_BYTES`` (the kubelet keeps a probe's output in the pod's events), and it gives up after a hard
timeout set below the probe's own. A sidecar that cannot be reached is hangwatch's own trouble: startup
and liveness then pass open, as the sidecar's own endpoints do; readiness fails.
"""

from __future__ import annotations

import http.client
from dataclasses import dataclass
from urllib.parse import urlsplit

from hangwatch.model.health import ProbeKind
from hangwatch.redact import scrub

OUTPUT_BYTES = 1024  # well under the kubelet's 10 KiB
ENDPOINTS = {ProbeKind.STARTUP: "/startup", ProbeKind.LIVENESS: "/live", ProbeKind.READINESS: "/ready"}


@dataclass(frozen=True)
class ProbeReply:
    passed: bool
    line: str

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1


def ask(base_url: str, kind: ProbeKind, timeout_s: float) -> ProbeReply:
    """One GET of the sidecar's endpoint for ``kind``, within ``timeout_s`` in all (connect and read)."""
    try:
        status, body = _request(base_url, "GET", ENDPOINTS[kind], timeout_s)
    except (OSError, http.client.HTTPException) as exc:
        trouble = _unanswered(base_url, exc)
        if kind is ProbeKind.READINESS:
            return ProbeReply(False, _cut(f"{kind.value}: not ready: {trouble}"))
        return ProbeReply(
            True, _cut(f"{kind.value}: passing open: {trouble}; hangwatch's own trouble never fails it")
        )
    said = body.splitlines()[0] if body else f"HTTP {status}"
    return ProbeReply(status == 200, _cut(f"{kind.value}: {said}"))


def dump(base_url: str, timeout_s: float) -> ProbeReply:
    """Ask the sidecar to write its whole report now (a preStop hook, before the pod goes): its path."""
    try:
        status, body = _request(base_url, "POST", "/dump", timeout_s)
    except (OSError, http.client.HTTPException) as exc:
        return ProbeReply(False, _cut(_unanswered(base_url, exc)))
    return ProbeReply(status == 200, _cut(body or f"HTTP {status}"))


def _request(base_url: str, method: str, path: str, timeout_s: float) -> tuple[int, str]:
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout_s)
    try:
        conn.request(method, path, headers={"Connection": "close", "Content-Length": "0"})
        reply = conn.getresponse()
        return reply.status, reply.read(OUTPUT_BYTES).decode("utf-8", "replace").strip()
    finally:
        conn.close()


def _unanswered(base_url: str, exc: Exception) -> str:
    return f"the sidecar at {base_url} did not answer ({exc.__class__.__name__}: {exc})"


def _cut(line: str) -> str:
    return scrub(line)[: OUTPUT_BYTES - 1]
