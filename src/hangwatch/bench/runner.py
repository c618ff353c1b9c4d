"""Run the bench: warm-up, then rounds that interleave the servers, with /metrics read around each share.

Interleaving is the point: on a shared machine load drifts, and a benchmark of A followed by one of B
measures the drift as much as the servers. Each round runs every server once, the order alternating
(A B, B A, A B ...) so neither always goes first, and every server gets the same prompts in the same
order and the same arrival times within a round (the round's seed).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import httpx

from hangwatch.analyse.bench.acceptance import counters_key
from hangwatch.bench.lean_transport import make_client
from hangwatch.bench.loadgen import run_load
from hangwatch.bench.openai_stream import ServerProblem
from hangwatch.bench.openai_stream import Target
from hangwatch.bench.openai_stream import list_models
from hangwatch.collect.prometheus import RawScrape
from hangwatch.collect.prometheus import afetch
from hangwatch.collect.prometheus import ascrape
from hangwatch.model.bench import LoadRun
from hangwatch.model.bench import Prompt
from hangwatch.model.bench import RequestRecord
from hangwatch.model.bench import RoundMeasurement
from hangwatch.model.bench import Workload
from hangwatch.model.metrics import MetricsSnapshot
from hangwatch.model.metrics import ScrapeError
from hangwatch.model.metrics import ScrapeFailure
from hangwatch.render.bench_progress import QuietProgress

SCRAPE_TIMEOUT_S = 5.0
SCRAPE_EVERY_S = 1.0  # during a share: the most requests running / waiting the server reports
SETTLE_TRIES = 10
SETTLE_GAP_S = 0.1
ROUND_SEED_STRIDE = 1000


def no_trouble() -> str | None:
    return None


@dataclass(frozen=True)
class Server:
    label: str  # "A", "B"
    base_url: str
    # A launched server's supervision says why the bench must stop (it crashed); None while all is well.
    trouble: Callable[[], str | None] = no_trouble
    metrics: bool = True  # read /metrics around each share (--no-metrics: do not)

    @property
    def metrics_url(self) -> str:
        return self.base_url + "/metrics"


class Listener(Protocol):
    """What the runner tells the progress display."""

    def share_started(
        self, label: str, round_: int, rounds: int, requests: int | None, duration_s: float | None
    ) -> None: ...

    def request_done(self, record: RequestRecord) -> None: ...

    def share_finished(self, label: str, run: LoadRun) -> None: ...

    def note(self, text: str) -> None: ...


async def discover_models(
    servers: Sequence[Server], model: str | None, timeout_s: float
) -> dict[str, str | ServerProblem]:
    """Each server's model name (the given one, else the first it lists), or why it cannot be used."""
    out: dict[str, str | ServerProblem] = {}
    async with make_client(2) as client:
        for s in servers:
            found = await list_models(client, s.base_url, timeout_s)
            if isinstance(found, ServerProblem):
                out[s.label] = found
            else:
                out[s.label] = model if model is not None else found[0]
    return out


def share_order(labels: Sequence[str], round_: int) -> list[str]:
    """A B in even rounds, B A in odd ones."""
    return list(labels) if round_ % 2 == 0 else list(reversed(labels))


async def _settled(client: httpx.AsyncClient, url: str) -> MetricsSnapshot | ScrapeError:
    """Scrape until two scrapes in a row agree on the counters a run moves (bounded)."""
    previous = await ascrape(client, url, SCRAPE_TIMEOUT_S)
    for _ in range(SETTLE_TRIES):
        if isinstance(previous, ScrapeError):
            return previous
        await asyncio.sleep(SETTLE_GAP_S)
        current = await ascrape(client, url, SCRAPE_TIMEOUT_S)
        if isinstance(current, ScrapeError) or counters_key(current) == counters_key(previous):
            return current
        previous = current
    return previous


async def _sample(client: httpx.AsyncClient, url: str, into: list[RawScrape]) -> None:
    """Fetch /metrics every SCRAPE_EVERY_S while requests run; parsed afterwards (see RawScrape)."""
    while True:
        await asyncio.sleep(SCRAPE_EVERY_S)
        raw = await afetch(client, url, SCRAPE_TIMEOUT_S)
        if isinstance(raw, RawScrape):
            into.append(raw)


@dataclass(frozen=True)
class _Side:
    """One server as the runner drives it: its label and trouble check, its HTTP client, what to request."""

    server: Server
    client: httpx.AsyncClient
    target: Target


async def _warm_up(side: _Side, workload: Workload, prompts: Sequence[Prompt], show: Listener) -> None:
    """Uncounted requests first: the first requests to a fresh server pay for lazy setup (compiles)."""
    run = await run_load(
        side.client, side.target, workload, prompts,
        seed=workload.seed - 1, should_stop=side.server.trouble, count=workload.warmup,
    )  # fmt: skip
    failed = [r for r in run.records if not r.ok]
    if failed:
        label, n = side.server.label, len(run.records)
        show.note(f"{label}: {len(failed)} of {n} warm-up requests failed: {failed[0].detail}")


async def _share(
    side: _Side, workload: Workload, prompts: Sequence[Prompt], show: Listener, *, round_: int, position: int
) -> RoundMeasurement:
    """One server's share of one round, with /metrics before, every second during, and settled after."""
    url = side.server.metrics_url
    if side.server.metrics:
        before = await ascrape(side.client, url, SCRAPE_TIMEOUT_S)
    else:
        before = ScrapeError(url, ScrapeFailure.SKIPPED, "not read (--no-metrics)")
    fetched: list[RawScrape] = []
    sampler = None
    if isinstance(before, MetricsSnapshot):
        sampler = asyncio.create_task(_sample(side.client, url, fetched))
    try:
        run = await run_load(
            side.client, side.target, workload, prompts,
            seed=workload.seed + round_ * ROUND_SEED_STRIDE,
            on_record=show.request_done, should_stop=side.server.trouble,
        )  # fmt: skip
    finally:
        if sampler is not None:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
    after = await _settled(side.client, url) if isinstance(before, MetricsSnapshot) else before
    during = [snap for snap in (raw.parse() for raw in fetched) if isinstance(snap, MetricsSnapshot)]
    show.share_finished(side.server.label, run)
    return RoundMeasurement(
        side.server.label,
        round_,
        position,
        run.records,
        run.duration_s,
        before,
        after,
        tuple(during),
        run.aborted,
    )


async def run_bench(
    servers: Sequence[Server],
    models: dict[str, str],
    workload: Workload,
    prompts: Sequence[Prompt],
    listener: Listener | None = None,
) -> dict[str, list[RoundMeasurement]]:
    """Warm every server up, then run ``workload.rounds`` interleaved rounds; the measurements by label."""
    show = listener or QuietProgress()
    out: dict[str, list[RoundMeasurement]] = {s.label: [] for s in servers}
    async with contextlib.AsyncExitStack() as stack:
        sides = {}
        for s in servers:
            # A connection per request in flight, plus one for /metrics: requests never wait for one.
            client = await stack.enter_async_context(make_client(workload.concurrency + 2))
            sides[s.label] = _Side(s, client, Target(s.base_url, models[s.label], workload.endpoint))
        if workload.warmup:
            for side in sides.values():
                await _warm_up(side, workload, prompts, show)
        for r in range(workload.rounds):
            for position, label in enumerate(share_order(list(sides), r)):
                show.share_started(label, r, workload.rounds, workload.requests, workload.duration_s)
                m = await _share(sides[label], workload, prompts, show, round_=r, position=position)
                out[label].append(m)
                if m.aborted:
                    return out  # a server that fails every request leaves nothing to compare: stop here
    return out
