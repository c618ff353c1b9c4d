"""The Prometheus boundary: scrape ``/metrics`` with httpx, parse it with prometheus_client's text parser.

``scrape(url, timeout)`` returns a :class:`MetricsSnapshot` or a :class:`ScrapeError` and never raises:
a server whose /metrics times out is evidence, not a reason to stop a benchmark or a watch loop.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from collections.abc import Collection
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hangwatch.model.metrics import MetricSample
from hangwatch.model.metrics import MetricsSnapshot
from hangwatch.model.metrics import ScrapeError
from hangwatch.model.metrics import ScrapeFailure
from hangwatch.redact import redact_url

MAX_BODY_BYTES = 32 * 2**20  # a vLLM exposition is about 100 KB; anything this big is not metrics


def only_samples(text: str, names: Collection[str]) -> str:
    """The exposition cut to the sample lines called one of ``names`` and their families' comments.

    A watch loop reads three figures of vLLM's ~100 KB exposition every 2 s; prometheus_client's pure
    Python parser spent most of the supervisor's CPU while serving on the other ~600 lines (measured:
    a third of its samples on a healthy TP=2 server). A line's name is what precedes its ``{`` or
    first space; a ``# TYPE``/``# HELP`` line is kept when the name it gives is a wanted one's family
    (``vllm:generation_tokens`` for ``vllm:generation_tokens_total``), so counters keep their type.
    Returns "" when nothing is kept (the caller then parses the whole text, so a body that is not
    Prometheus at all is still said so).
    """
    wanted = frozenset(names)
    kept: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            words = line.split(maxsplit=3)
            if len(words) >= 3 and words[1] in ("TYPE", "HELP"):
                family = words[2]
                if any(w == family or w.startswith(family + "_") for w in wanted):
                    kept.append(line)
            continue
        end = len(line)
        for sep in ("{", " "):
            at = line.find(sep)
            if 0 <= at < end:
                end = at
        if line[:end] in wanted:
            kept.append(line)
    return "\n".join(kept) + "\n" if any(not k.startswith("#") for k in kept) else ""


def parse(
    text: str, url: str = "", t: float = 0.0, only: Collection[str] | None = None
) -> MetricsSnapshot | ScrapeError:
    """Exposition text to a snapshot. Text the parser rejects is a ``not-prometheus`` error.

    ``only``: the sample names wanted; the rest of the text is skipped before parsing (only_samples).
    """
    shown = redact_url(url)
    if only is not None:
        text = only_samples(text, only) or text
    by_name: dict[str, list[MetricSample]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = tuple(sorted(s.labels.items()))
                by_name.setdefault(s.name, []).append(MetricSample(s.name, labels, float(s.value)))
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        first = text.lstrip()[:60].splitlines()[0] if text.strip() else ""
        return ScrapeError(
            shown, ScrapeFailure.NOT_PROMETHEUS, f"not Prometheus text ({exc}); it starts {first!r}"
        )
    return MetricsSnapshot(shown, t, {name: tuple(samples) for name, samples in by_name.items()})


def scrape(
    url: str,
    timeout: float = 5.0,
    client: httpx.Client | None = None,
    clock: Callable[[], float] = time.monotonic,
    only: Collection[str] | None = None,
) -> MetricsSnapshot | ScrapeError:
    """GET ``url`` and parse it. Pass a ``client`` to reuse its connection across scrapes, ``only`` the
    sample names wanted when the rest need not be parsed."""
    own = client is None
    http = client if client is not None else httpx.Client(trust_env=False)
    try:
        response = http.get(url, timeout=timeout, headers=_HEADERS)
        body = response.content[:MAX_BODY_BYTES]
    except Exception as exc:  # the boundary: every failure becomes a value
        return _failure(url, exc, timeout)
    finally:
        if own:
            http.close()
    return _snapshot(url, response.status_code, body, clock(), only)


async def ascrape(
    client: httpx.AsyncClient, url: str, timeout: float = 5.0, clock: Callable[[], float] = time.monotonic
) -> MetricsSnapshot | ScrapeError:
    """:func:`scrape` for an asyncio caller, on its AsyncClient."""
    raw = await afetch(client, url, timeout, clock)
    return raw if isinstance(raw, ScrapeError) else raw.parse()


@dataclass(frozen=True)
class RawScrape:
    """An exposition fetched, not parsed yet. Parsing vLLM's takes about 15 ms of pure Python, time a load
    generator's event loop cannot spare while it streams: fetch during the run, parse after it."""

    url: str
    t: float
    status: int
    body: bytes

    def parse(self) -> MetricsSnapshot | ScrapeError:
        return _snapshot(self.url, self.status, self.body, self.t)


async def afetch(
    client: httpx.AsyncClient, url: str, timeout: float = 5.0, clock: Callable[[], float] = time.monotonic
) -> RawScrape | ScrapeError:
    try:
        response = await client.get(url, timeout=timeout, headers=_HEADERS)
        body = response.content[:MAX_BODY_BYTES]
    except Exception as exc:  # the boundary: every failure becomes a value
        return _failure(url, exc, timeout)
    return RawScrape(url, clock(), response.status_code, body)


_HEADERS = {"User-Agent": "hangwatch-metrics"}


def _snapshot(
    url: str, status: int, body: bytes, t: float, only: Collection[str] | None = None
) -> MetricsSnapshot | ScrapeError:
    if status != 200:
        hint = " (the server exposes no metrics here)" if status == 404 else ""
        return ScrapeError(redact_url(url), ScrapeFailure.HTTP_STATUS, f"HTTP {status}{hint}", status)
    return parse(body.decode("utf-8", "replace"), url, t, only)


def _failure(url: str, exc: Exception, timeout: float) -> ScrapeError:
    shown = redact_url(url)
    if isinstance(exc, httpx.ConnectError) and refused(exc):
        return ScrapeError(shown, ScrapeFailure.REFUSED, "connection refused: nothing listens on the port")
    if isinstance(exc, httpx.TimeoutException):
        return ScrapeError(shown, ScrapeFailure.TIMEOUT, f"no answer within {timeout:g} s")
    return ScrapeError(shown, ScrapeFailure.ERROR, f"{type(exc).__name__}: {exc}")


def refused(exc: BaseException) -> bool:
    """httpx wraps the socket's error; walk the chain for ECONNREFUSED."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError) or getattr(seen, "errno", None) == errno.ECONNREFUSED:
            return True
        if f"[Errno {errno.ECONNREFUSED}]" in str(seen):  # asyncio: "Multiple exceptions: [Errno 111] ..."
            return True
        seen = seen.__cause__ or seen.__context__
    return "refused" in str(exc).lower()
