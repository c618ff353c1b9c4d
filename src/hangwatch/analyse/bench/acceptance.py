"""Speculative-decoding acceptance and server-side token counts from /metrics, as each engine defines them
(the names and the arithmetic are the engines' facts: each profile's ``spec``, read through the registry).

vLLM (docs/engine-facts.md, ``v1/spec_decode/metrics.py``): counters, read as deltas over the run.
  acceptance rate         = accepted tokens / draft tokens
  mean acceptance length  = 1 + accepted tokens / drafts        (the bonus token included)
  per-position rate [i]   = accepted tokens at position i / drafts
SGLang (docs/engine-facts.md): gauges recomputed every decode-log interval (40 decode steps) and then reset,
so the only figure the server exposes is that of its last interval: we report the value read after the
run and say so. Deltas of several rounds are added before dividing, never averaged as ratios.
"""

from __future__ import annotations

from collections.abc import Sequence

from hangwatch.engines import registry
from hangwatch.model.bench import RoundMeasurement
from hangwatch.model.bench import ServerMetrics
from hangwatch.model.bench import SpecStats
from hangwatch.model.metrics import MetricNames
from hangwatch.model.metrics import MetricsSnapshot
from hangwatch.model.metrics import ScrapeError
from hangwatch.model.metrics import ScrapeFailure
from hangwatch.model.metrics import counter_delta


def engine_names(snapshot: MetricsSnapshot) -> MetricNames | None:
    """Which engine's metric names the server exposes (by prefix); None for none of the profiles'."""
    for names in registry.metric_names():
        if snapshot.names(names.engine + ":"):
            return names
    return None


def _both(m: RoundMeasurement) -> tuple[MetricsSnapshot, MetricsSnapshot] | ScrapeError:
    if isinstance(m.before, ScrapeError):
        return m.before
    if isinstance(m.after, ScrapeError):
        return m.after
    return m.before, m.after


def spec_for_rounds(rounds: Sequence[RoundMeasurement]) -> tuple[SpecStats | None, str | None]:
    """Acceptance over the given rounds (one round, or all of one server's), and a note when there is none."""
    pairs = [p for p in map(_both, rounds) if not isinstance(p, ScrapeError)]
    failures = [p for p in map(_both, rounds) if isinstance(p, ScrapeError)]
    if not pairs:
        if failures and failures[0].kind is ScrapeFailure.SKIPPED:
            return None, "no speculative-decoding figures: /metrics not read (--no-metrics)"
        why = failures[0].describe() if failures else "no rounds"
        return None, f"no speculative-decoding figures: /metrics could not be read ({why})"
    partial = f" ({len(failures)} of {len(rounds)} rounds without /metrics)" if failures else ""
    names = engine_names(pairs[-1][1])
    engine = registry.by_metrics(names) if names is not None else None
    spec = engine.spec if engine is not None else None
    stats = spec.stats(pairs) if spec is not None else None
    if spec is None or stats is None:
        return None, (spec.absent if spec is not None else None) or _no_spec_metrics()
    if spec.caveat is not None:
        return stats, spec.caveat + partial
    if not stats.drafts:
        return (
            stats,
            "speculative decoding is configured, but no drafts were proposed during the run" + partial,
        )
    return stats, (
        f"figures cover {len(pairs)} of {len(rounds)} rounds; the others had no /metrics"
        if failures
        else None
    )


def server_metrics(rounds: Sequence[RoundMeasurement]) -> tuple[ServerMetrics | None, str | None]:
    """Tokens the server says it generated (counter deltas), and the most requests running/waiting seen."""
    pairs = [p for p in map(_both, rounds) if not isinstance(p, ScrapeError)]
    if not pairs:
        failures = [p for p in map(_both, rounds) if isinstance(p, ScrapeError)]
        if failures and failures[0].kind is ScrapeFailure.SKIPPED:
            return None, None  # asked for: the spec note says it once
        return None, f"/metrics could not be read: {failures[0].describe() if failures else 'no rounds'}"
    names = engine_names(pairs[-1][1])
    scrapes = sum(2 + len(m.during) for m in rounds)
    if names is None:
        prefixes = " nor ".join(f"{n.engine}:" for n in registry.metric_names())
        return ServerMetrics(
            None, None, None, None, None, scrapes
        ), f"/metrics has neither {prefixes} metrics"
    gen = [counter_delta(b, a, names.generation_tokens) for b, a in pairs]
    prompt = [counter_delta(b, a, names.prompt_tokens) for b, a in pairs]
    # Only scrapes taken while requests ran: before and after, the server is idle by construction.
    seen = [s for m in rounds for s in m.during]
    running = [v for v in (s.value(names.running) for s in seen) if v is not None]
    waiting = [v for v in (s.value(names.waiting) for s in seen) if v is not None]
    return (
        ServerMetrics(
            engine=names.engine,
            generation_tokens=round(sum(g for g in gen if g is not None))
            if any(g is not None for g in gen)
            else None,
            prompt_tokens=round(sum(p for p in prompt if p is not None))
            if any(p is not None for p in prompt)
            else None,
            running_max=max(running) if running else None,
            waiting_max=max(waiting) if waiting else None,
            scrapes=scrapes,
        ),
        None,
    )


def counters_key(snapshot: MetricsSnapshot) -> tuple[float | None, ...]:
    """The counters a run moves. A scrape is settled when two in a row agree on them: vLLM records an
    engine step's stats right after handing out its tokens, so the very last step can land a moment late."""
    names = engine_names(snapshot)
    generated = snapshot.value(names.generation_tokens) if names is not None else None
    spec = [n for e in registry.ENGINES if e.spec is not None for n in e.spec.counters]
    return (generated, *(snapshot.value(n) for n in spec))


def _no_spec_metrics() -> str:
    names = " or ".join(e.spec.names for e in registry.ENGINES if e.spec is not None)
    return f"the server exposes no speculative-decoding metrics (no {names})"
