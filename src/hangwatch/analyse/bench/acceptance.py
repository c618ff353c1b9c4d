"""Speculative-decoding acceptance and server-side token counts from /metrics, as each engine defines them
(the names are the engines' facts: engines/vllm.py, engines/sglang.py).

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
from dataclasses import dataclass

from hangwatch.engines import PROFILES
from hangwatch.engines.sglang import SPEC_ACCEPT_LENGTH as SGLANG_ACCEPT_LENGTH
from hangwatch.engines.sglang import SPEC_ACCEPT_RATE as SGLANG_ACCEPT_RATE
from hangwatch.engines.sglang import SPEC_VERIFY_CALLS as SGLANG_VERIFY_CALLS
from hangwatch.engines.vllm import SPEC_ACCEPTED as VLLM_ACCEPTED
from hangwatch.engines.vllm import SPEC_ACCEPTED_PER_POS as VLLM_ACCEPTED_PER_POS
from hangwatch.engines.vllm import SPEC_DRAFT_TOKENS as VLLM_DRAFT_TOKENS
from hangwatch.engines.vllm import SPEC_DRAFTS as VLLM_DRAFTS
from hangwatch.model.bench import RoundMeasurement
from hangwatch.model.bench import ServerMetrics
from hangwatch.model.bench import SpecStats
from hangwatch.model.metrics import MetricNames
from hangwatch.model.metrics import MetricsSnapshot
from hangwatch.model.metrics import ScrapeError
from hangwatch.model.metrics import ScrapeFailure
from hangwatch.model.metrics import counter_delta

# Which engine's names a server exposes: the profiles that have /metrics.
ENGINES: tuple[MetricNames, ...] = tuple(p.metrics for p in PROFILES.values() if p.metrics is not None)


def engine_names(snapshot: MetricsSnapshot) -> MetricNames | None:
    """Which engine's metric names the server exposes (by prefix); None for neither."""
    for names in ENGINES:
        if snapshot.names(names.engine + ":"):
            return names
    return None


@dataclass(frozen=True)
class VllmSpecCounts:
    """Counter deltas of one window; windows add up."""

    drafts: int
    draft_tokens: int
    accepted: int
    per_position: tuple[int, ...]

    def __add__(self, other: VllmSpecCounts) -> VllmSpecCounts:
        width = max(len(self.per_position), len(other.per_position))
        mine = self.per_position + (0,) * (width - len(self.per_position))
        theirs = other.per_position + (0,) * (width - len(other.per_position))
        return VllmSpecCounts(
            self.drafts + other.drafts,
            self.draft_tokens + other.draft_tokens,
            self.accepted + other.accepted,
            tuple(a + b for a, b in zip(mine, theirs, strict=True)),
        )


def vllm_spec_counts(before: MetricsSnapshot, after: MetricsSnapshot) -> VllmSpecCounts | None:
    """Deltas of vLLM's spec-decoding counters, summed over labels (engine, model_name); None if absent."""
    drafts = counter_delta(before, after, VLLM_DRAFTS)
    draft_tokens = counter_delta(before, after, VLLM_DRAFT_TOKENS)
    accepted = counter_delta(before, after, VLLM_ACCEPTED)
    if drafts is None or draft_tokens is None or accepted is None:
        return None
    start = before.by_label(VLLM_ACCEPTED_PER_POS, "position")
    end = after.by_label(VLLM_ACCEPTED_PER_POS, "position")
    positions = sorted((p for p in end if p.isdigit()), key=int)
    per_position = tuple(round(end[p] - start.get(p, 0.0)) for p in positions)
    return VllmSpecCounts(round(drafts), round(draft_tokens), round(accepted), per_position)


def vllm_spec_stats(counts: VllmSpecCounts) -> SpecStats:
    """The three figures exactly as ``SpecDecodingProm`` defines them; None where the divisor is zero."""
    rate = counts.accepted / counts.draft_tokens if counts.draft_tokens else None
    length = 1 + counts.accepted / counts.drafts if counts.drafts else None
    per_pos = tuple(a / counts.drafts for a in counts.per_position) if counts.drafts else ()
    return SpecStats(
        engine="vllm",
        acceptance_rate=rate,
        mean_acceptance_length=length,
        per_position=per_pos,
        drafts=counts.drafts,
        draft_tokens=counts.draft_tokens,
        accepted_tokens=counts.accepted,
        accepted_per_position=counts.per_position,
        source="vllm:spec_decode_* counter deltas over the run",
    )


def _gauge_mean(snapshot: MetricsSnapshot, name: str) -> float | None:
    """A gauge exposed once per rank or engine: the mean, since a sum of rates means nothing."""
    values = [s.value for s in snapshot.samples.get(name, ())]
    return sum(values) / len(values) if values else None


def sglang_spec_stats(before: MetricsSnapshot, after: MetricsSnapshot) -> SpecStats | None:
    length = _gauge_mean(after, SGLANG_ACCEPT_LENGTH)
    rate = _gauge_mean(after, SGLANG_ACCEPT_RATE)
    if length is None and rate is None:
        return None
    verified = counter_delta(before, after, SGLANG_VERIFY_CALLS)
    if not length and not rate and not verified:
        return None  # the gauges exist at 0 on a server without speculative decoding
    return SpecStats(
        engine="sglang",
        acceptance_rate=rate,
        mean_acceptance_length=length,
        per_position=(),
        source="sglang:spec_accept_rate / spec_accept_length after the run (its last decode-log interval)",
    )


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
    if names is not None and names.engine == "sglang":
        stats = sglang_spec_stats(pairs[0][0], pairs[-1][1])
        if stats is None:
            return (
                None,
                "the server exposes no speculative-decoding acceptance (sglang:spec_accept_* absent or 0)",
            )
        return stats, "SGLang exposes acceptance only as gauges over its last 40 decode steps" + partial
    counts = [vllm_spec_counts(before, after) for before, after in pairs]
    present = [c for c in counts if c is not None]
    if not present:
        return (
            None,
            "the server exposes no speculative-decoding metrics (no vllm:spec_decode_* or sglang:spec_*)",
        )
    total = present[0]
    for c in present[1:]:
        total = total + c
    stats = vllm_spec_stats(total)
    if not total.drafts:
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
        return ServerMetrics(
            None, None, None, None, None, scrapes
        ), "/metrics has neither vllm: nor sglang: metrics"
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
    spec = (VLLM_DRAFTS, VLLM_DRAFT_TOKENS, VLLM_ACCEPTED, SGLANG_VERIFY_CALLS)
    return (generated, *(snapshot.value(n) for n in spec))
