"""Bench figures from request records: percentiles, throughput, and the comparison over interleaved rounds.

Definitions follow vLLM's benchmark client (``vllm/benchmarks/serve.py``) so the two can be compared:
percentiles interpolate linearly (numpy's default), throughput is output tokens of successful requests
over the wall time of the run, TPOT is (e2e - TTFT) / (output tokens - 1) per request.

The comparison never trusts one round: on a shared machine single rounds disagree widely
(docs/engine-facts.md: 0.85x then 3.03x for the same pair). The outcome is "faster" or "slower" only
when every round agrees; when the round ratios straddle 1.0 it is "no clear difference".
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from hangwatch.analyse.bench.acceptance import server_metrics
from hangwatch.analyse.bench.acceptance import spec_for_rounds
from hangwatch.model.bench import BENCH_SCHEMA
from hangwatch.model.bench import CURVE_STEP_PCT
from hangwatch.model.bench import BenchReport
from hangwatch.model.bench import Boot
from hangwatch.model.bench import Comparison
from hangwatch.model.bench import Distributions
from hangwatch.model.bench import Outcome
from hangwatch.model.bench import Percentiles
from hangwatch.model.bench import RatioSpread
from hangwatch.model.bench import RequestRecord
from hangwatch.model.bench import RoundMeasurement
from hangwatch.model.bench import RoundRatio
from hangwatch.model.bench import RoundResult
from hangwatch.model.bench import ServerResult
from hangwatch.model.bench import SpecStats
from hangwatch.model.bench import Workload

NEGLIGIBLE = 0.02  # rounds all within 2 % of 1.0: no clear difference, even on one side


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile with linear interpolation between closest ranks (numpy's default method)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def percentiles(values: Sequence[float]) -> Percentiles:
    return Percentiles(percentile(values, 50), percentile(values, 90), percentile(values, 99))


def quantile_curve(values: Sequence[float]) -> tuple[float, ...]:
    if not values:
        return ()
    return tuple(percentile(values, q) or 0.0 for q in range(0, 101, CURVE_STEP_PCT))


def _ok(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.ok]


def _tpot(r: RequestRecord) -> float | None:
    if r.ttft_s is None or r.output_tokens is None or r.output_tokens < 2:
        return None
    return (r.e2e_s - r.ttft_s) / (r.output_tokens - 1)


def _ratio(second: float | None, first: float | None) -> float | None:
    if second is None or first is None or first <= 0:
        return None
    return second / first


def _latency_ratio(second: float | None, first: float | None) -> float | None:
    """A ratio of latencies, None when either is 0: a median gap of 0 means most chunks arrived together
    (several tokens per read, as vLLM streams them), which is not a latency to compare."""
    if second is None or second <= 0:
        return None
    return _ratio(second, first)


def round_result(m: RoundMeasurement) -> RoundResult:
    ok = _ok(m.records)
    tokens = sum(r.output_tokens or 0 for r in ok)
    spec, _ = spec_for_rounds([m])
    return RoundResult(
        round=m.round,
        position=m.position,
        duration_s=m.duration_s,
        requests=len(m.records),
        errors=len(m.records) - len(ok),
        output_tokens=tokens,
        output_tokens_per_s=tokens / m.duration_s if m.duration_s > 0 else 0.0,
        ttft_p50_s=percentile([r.ttft_s for r in ok if r.ttft_s is not None], 50),
        itl_p50_s=percentile([gap for r in ok for gap in r.itl_s], 50),
        e2e_p50_s=percentile([r.e2e_s for r in ok], 50),
        spec=spec,
    )


def server_result(
    label: str, url: str, model: str, measurements: Sequence[RoundMeasurement], boot: Boot | None = None
) -> ServerResult:
    """Everything one server did over all its rounds (warm-up excluded: it is never measured)."""
    records = [r for m in measurements for r in m.records]
    ok = _ok(records)
    failed = [r for r in records if not r.ok]
    kinds = Counter(r.error.value for r in failed if r.error is not None)
    examples: dict[str, str] = {}
    for r in failed:
        if r.error is not None and r.error.value not in examples:
            examples[r.error.value] = r.detail or ""
    duration = sum(m.duration_s for m in measurements)
    tokens = sum(r.output_tokens or 0 for r in ok)
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [gap for r in ok for gap in r.itl_s]
    e2e = [r.e2e_s for r in ok]
    tpot = [t for t in map(_tpot, ok) if t is not None]
    spec, spec_note = spec_for_rounds(measurements)
    metrics, metrics_note = server_metrics(measurements)
    aborted = next((m.aborted for m in measurements if m.aborted), None)
    return ServerResult(
        label=label,
        url=url,
        model=model,
        requests=len(records),
        errors=len(failed),
        errors_by_kind=dict(sorted(kinds.items())),
        error_examples=examples,
        output_tokens=tokens,
        prompt_tokens=sum(r.prompt_tokens or 0 for r in ok),
        duration_s=duration,
        requests_per_s=len(ok) / duration if duration > 0 else 0.0,
        output_tokens_per_s=tokens / duration if duration > 0 else 0.0,
        ttft_s=percentiles(ttft),
        itl_s=percentiles(itl),
        tpot_s=percentiles(tpot),
        e2e_s=percentiles(e2e),
        spec=spec,
        spec_note=spec_note,
        server_metrics=metrics,
        metrics_note=metrics_note,
        rounds=tuple(round_result(m) for m in measurements),
        distributions=Distributions(quantile_curve(ttft), quantile_curve(itl), quantile_curve(e2e)),
        aborted=aborted,
        boot=boot,
    )


def _spread(pairs: Sequence[float | None], overall: float | None) -> RatioSpread:
    valid = [p for p in pairs if p is not None]
    return RatioSpread(overall, min(valid) if valid else None, max(valid) if valid else None)


def outcome_of(round_ratios: Sequence[float | None]) -> Outcome:
    """faster / slower only when every round agrees; a spread that straddles 1.0 is no clear difference,
    and so is one that stays within NEGLIGIBLE of 1.0 (a server compared with itself lands there)."""
    valid = [r for r in round_ratios if r is not None]
    if len(valid) < 2 or len(valid) < len(round_ratios):
        return Outcome.INCONCLUSIVE
    if min(valid) > 1.0 and max(valid) > 1.0 + NEGLIGIBLE:
        return Outcome.FASTER
    if max(valid) < 1.0 and min(valid) < 1.0 - NEGLIGIBLE:
        return Outcome.SLOWER
    return Outcome.NO_CLEAR_DIFFERENCE


def compare(first: ServerResult, second: ServerResult) -> Comparison:
    by_round = {r.round: r for r in first.rounds}
    ratios = []
    for b in second.rounds:
        a = by_round.get(b.round)
        if a is None:
            continue
        ratios.append(
            RoundRatio(
                round=b.round,
                output_tokens_per_s_ratio=_ratio(b.output_tokens_per_s, a.output_tokens_per_s),
                ttft_p50_ratio=_latency_ratio(b.ttft_p50_s, a.ttft_p50_s),
                itl_p50_ratio=_latency_ratio(b.itl_p50_s, a.itl_p50_s),
                e2e_p50_ratio=_latency_ratio(b.e2e_p50_s, a.e2e_p50_s),
            )
        )
    overall = _ratio(second.output_tokens_per_s, first.output_tokens_per_s)
    throughput = _spread([r.output_tokens_per_s_ratio for r in ratios], overall)
    outcome = outcome_of([r.output_tokens_per_s_ratio for r in ratios])
    return Comparison(
        first=f"{first.label} ({first.url})",
        second=f"{second.label} ({second.url})",
        output_tokens_per_s_ratio=overall,
        output_tokens_per_s_spread=throughput,
        ttft_p50=_spread(
            [r.ttft_p50_ratio for r in ratios], _latency_ratio(second.ttft_s.p50, first.ttft_s.p50)
        ),
        itl_p50=_spread([r.itl_p50_ratio for r in ratios], _latency_ratio(second.itl_s.p50, first.itl_s.p50)),
        e2e_p50=_spread([r.e2e_p50_ratio for r in ratios], _latency_ratio(second.e2e_s.p50, first.e2e_s.p50)),
        rounds=tuple(ratios),
        outcome=outcome,
        verdict=verdict_text(first, second, throughput, outcome, len(ratios)),
    )


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %" if x < 0.1 else f"{100 * x:.0f} %"


def _acceptance(spec: SpecStats | None) -> str:
    if spec is None:
        return "none"
    if spec.acceptance_rate is None:
        return "no drafts proposed"
    return _pct(spec.acceptance_rate)


def _invert(spread: RatioSpread, outcome: Outcome) -> tuple[RatioSpread, Outcome]:
    """The same comparison seen from the other side."""
    assert spread.ratio and spread.low and spread.high  # verdict_text returned early on a zero
    flipped = {Outcome.FASTER: Outcome.SLOWER, Outcome.SLOWER: Outcome.FASTER}.get(outcome, outcome)
    return RatioSpread(1 / spread.ratio, 1 / spread.high, 1 / spread.low), flipped


def verdict_text(
    first: ServerResult, second: ServerResult, spread: RatioSpread, outcome: Outcome, rounds: int
) -> str:
    """One plain sentence. Said as speculative vs plain when exactly one side decodes speculatively."""
    if spread.ratio is None or spread.low is None or spread.high is None or spread.low <= 0:
        idle = [
            s for s in (first, second) if any(r.output_tokens_per_s <= 0 for r in s.rounds) or not s.rounds
        ]
        broken = idle[0] if idle else second
        failed = f"{broken.errors} of {broken.requests} requests failed"
        return f"no comparison: {broken.label} produced no output tokens in a round ({failed})"
    subject, other, extra = second.label, first.label, ""
    if (first.spec is None) != (second.spec is None):
        spec_side = second if second.spec is not None else first
        if spec_side is first:
            spread, outcome = _invert(spread, outcome)
        subject, other = "speculative decoding", "the plain server"
        extra = f" at {_acceptance(spec_side.spec)} acceptance" if spec_side.spec else ""
        if spec_side.spec and spec_side.spec.acceptance_rate is None:
            extra = " (no drafts proposed)"
    elif first.spec is not None and second.spec is not None:
        both = f"{first.label} {_acceptance(first.spec)}, {second.label} {_acceptance(second.spec)}"
        extra = f" (acceptance {both})"
    assert spread.ratio is not None and spread.low is not None and spread.high is not None
    ratio = f"{spread.ratio:.2f}x"
    span = f"{spread.low:.2f}-{spread.high:.2f}x over {rounds} rounds"
    if outcome is Outcome.FASTER:
        text = f"{subject} is faster than {other}: {ratio} output tokens/s ({span}){extra}"
    elif outcome is Outcome.SLOWER:
        text = f"{subject} is slower than {other}: {ratio} output tokens/s ({span}){extra}"
    elif outcome is Outcome.NO_CLEAR_DIFFERENCE:
        text = (
            f"no clear difference: {subject} ran at {ratio} {other}'s output tokens/s, "
            f"but single rounds range {span}{extra}"
        )
    elif rounds < 2:
        text = (
            f"one round only: {subject} ran at {ratio} {other}'s output tokens/s{extra}; "
            "run 3 or more interleaved rounds (--rounds) for a verdict"
        )
    else:
        text = (
            f"inconclusive: a round produced no output tokens; "
            f"{subject} ran at {ratio} {other}'s output tokens/s{extra}"
        )
    failures = [
        f"{s.errors} of {s.requests} requests failed on {s.label}" for s in (first, second) if s.errors
    ]
    return "; ".join([text, *failures])


def bench_report(
    workload: Workload,
    servers: Sequence[tuple[str, str, str]],
    measurements: dict[str, list[RoundMeasurement]],
    *,
    boots: dict[str, Boot],
    started_at: str,
    version: str,
    notes: Sequence[str] = (),
) -> BenchReport:
    """The whole report. ``servers``: (label, url, model) in the order given; ratios are second over first."""
    results = tuple(
        server_result(label, url, model, measurements.get(label, []), boots.get(label))
        for label, url, model in servers
    )
    comparison = compare(results[0], results[1]) if len(results) == 2 else None
    return BenchReport(BENCH_SCHEMA, started_at, version, workload, results, comparison, tuple(notes))
