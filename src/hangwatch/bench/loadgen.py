"""The load generator: many streamed requests to one server, bounded in count and in time.

A run sends a fixed number of requests, or keeps sending for a duration; at most ``concurrency`` are in
flight, and with a ``rate`` they start at Poisson arrival times. Prompt order and arrival times come from
a seed, so two servers given the same seed get the same sequence. A run in which nothing has succeeded
stops after one wave of failures (and cancels what is in flight) instead of waiting out every timeout:
a URL with no server behind it takes milliseconds, not ``requests x timeout``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence

import httpx

from hangwatch.bench.openai_stream import Target
from hangwatch.bench.openai_stream import request_once
from hangwatch.model.bench import ErrorKind
from hangwatch.model.bench import LoadRun
from hangwatch.model.bench import Prompt
from hangwatch.model.bench import RequestRecord
from hangwatch.model.bench import Workload

MAX_REQUESTS_PER_RUN = 1_000_000  # a --duration run stops here at the latest
PROMPT_PASSES = 64  # a --duration run cycles through at most this many shuffles of the prompt set


def poisson_offsets(rate: float, seed: int) -> Iterator[float]:
    """Arrival times (s from the start) of a Poisson process: exponential gaps with mean 1/rate, seeded."""
    rng = random.Random(seed)
    t = 0.0
    while True:
        yield t
        t += rng.expovariate(rate)


def prompt_order(prompts: Sequence[Prompt], seed: int, count: int) -> list[Prompt]:
    """``count`` prompts in a seeded order. Each pass over the set is a fresh shuffle, so no prompt repeats
    before all were used; the same seed gives every server the same sequence."""
    rng = random.Random(seed)
    out: list[Prompt] = []
    while len(out) < count:
        batch = list(prompts)
        rng.shuffle(batch)
        out.extend(batch[: count - len(out)])
    return out


def abort_after(concurrency: int) -> int:
    """Failures in a row, with no success yet, after which a run stops: about one wave of requests."""
    return max(3, min(concurrency, 16))


class _Run:
    """The bookkeeping of one run: in-flight tasks, finished records, and whether to stop."""

    def __init__(self, concurrency: int, on_record: Callable[[RequestRecord], None] | None) -> None:
        self.slots = asyncio.Semaphore(concurrency)
        self.t0 = time.perf_counter()
        self.records: list[RequestRecord] = []
        self.pending: dict[asyncio.Task[RequestRecord], tuple[int, float]] = {}
        self.aborted: str | None = None
        self._on_record = on_record
        self._ok = 0
        self._failed_in_a_row = 0
        self._gone_in_a_row = 0  # refused or no connection: nothing listens (any more)
        self._threshold = abort_after(concurrency)

    def abort(self, reason: str) -> None:
        if self.aborted is None:
            self.aborted = reason
            for task in self.pending:
                task.cancel()  # no point waiting out their timeouts

    def start(self, index: int, make: Callable[[float], asyncio.Task[RequestRecord]]) -> None:
        """Start request ``index``: ``make(sent_s)`` creates its task."""
        sent = time.perf_counter() - self.t0
        task = make(sent)
        self.pending[task] = (index, sent)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[RequestRecord]) -> None:
        self.slots.release()
        index, sent = self.pending.pop(task)
        if task.cancelled():
            gone = time.perf_counter() - self.t0 - sent
            rec = RequestRecord(
                index, sent, None, (), gone, None, None, 0, ErrorKind.CANCELLED, "the run stopped"
            )
        else:
            rec = task.result()
        self.records.append(rec)
        if rec.ok:
            self._ok += 1
            self._failed_in_a_row = self._gone_in_a_row = 0
        elif rec.error is not ErrorKind.CANCELLED:
            self._failed_in_a_row += 1
            gone = rec.error in (ErrorKind.REFUSED, ErrorKind.CONNECT)
            self._gone_in_a_row = self._gone_in_a_row + 1 if gone else 0
            if not self._ok and self._failed_in_a_row >= self._threshold:
                why = f"{rec.error}: {rec.detail}"
                self.abort(f"stopped after {self._threshold} failed requests and no success ({why})")
            elif self._gone_in_a_row >= self._threshold:
                # Refused by a server that answered before: it went away. Refusals are instant, so the rest
                # of the run would be sent (and fail) in a moment and say nothing more.
                self.abort(f"stopped after {self._gone_in_a_row} requests in a row found nothing listening")
        if self._on_record is not None:
            self._on_record(rec)

    def result(self) -> LoadRun:
        records = sorted(self.records, key=lambda r: r.index)
        end = max((r.sent_s + r.e2e_s for r in records), default=0.0)
        first = min((r.sent_s for r in records), default=0.0)
        return LoadRun(tuple(records), end - first, self.aborted)


async def run_load(
    client: httpx.AsyncClient,
    target: Target,
    workload: Workload,
    prompts: Sequence[Prompt],
    *,
    seed: int,
    on_record: Callable[[RequestRecord], None] | None = None,
    should_stop: Callable[[], str | None] = lambda: None,
    count: int | None = None,
) -> LoadRun:
    """Send the workload to one server: ``count`` (default ``workload.requests``) requests, or requests for
    ``workload.duration_s`` seconds. ``should_stop`` is asked before each request (a launched server that
    crashed says why)."""
    limit = count if count is not None else (workload.requests or MAX_REQUESTS_PER_RUN)
    duration = workload.duration_s if count is None else None
    order = prompt_order(prompts, seed, min(limit, len(prompts) * PROMPT_PASSES))
    arrivals = poisson_offsets(workload.rate, seed) if workload.rate else None
    run = _Run(workload.concurrency, on_record)
    deadline = run.t0 + duration if duration else None
    try:
        for i in range(limit):
            reason = should_stop()
            if reason:
                run.abort(reason)
            if run.aborted:
                break
            if arrivals is not None:
                at = run.t0 + next(arrivals)
                if deadline is not None and at >= deadline:
                    break
                await asyncio.sleep(max(0.0, at - time.perf_counter()))
            remaining = None if deadline is None else deadline - time.perf_counter()
            if remaining is not None and remaining <= 0:
                break
            try:
                await asyncio.wait_for(run.slots.acquire(), remaining)
            except TimeoutError:
                break
            if run.aborted:
                run.slots.release()
                break
            prompt = order[i % len(order)]

            def make(sent: float, index: int = i, prompt: Prompt = prompt) -> asyncio.Task[RequestRecord]:
                return asyncio.create_task(
                    request_once(client, target, prompt, workload, index=index, sent_s=sent)
                )

            run.start(i, make)
        if run.pending:
            # gather() returns after every task's done callbacks ran (ours came first): records are complete.
            await asyncio.gather(*run.pending, return_exceptions=True)
    finally:
        if run.pending:  # cancelled from outside (Ctrl-C): take the in-flight requests down with us
            for task in list(run.pending):
                task.cancel()
            await asyncio.gather(*run.pending, return_exceptions=True)
    return run.result()
