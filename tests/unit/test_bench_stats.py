"""Percentiles, throughput and the comparison over interleaved rounds, on hand-built records."""

from __future__ import annotations

import pytest

from hangwatch.analyse.bench.stats import compare
from hangwatch.analyse.bench.stats import outcome_of
from hangwatch.analyse.bench.stats import percentile
from hangwatch.analyse.bench.stats import percentiles
from hangwatch.analyse.bench.stats import server_result
from hangwatch.model.bench import ErrorKind
from hangwatch.model.bench import Outcome
from hangwatch.model.bench import RequestRecord
from hangwatch.model.bench import RoundMeasurement
from hangwatch.model.metrics import ScrapeError
from hangwatch.model.metrics import ScrapeFailure

NO_METRICS = ScrapeError("http://127.0.0.1:1/metrics", ScrapeFailure.HTTP_STATUS, "HTTP 404", 404)


def ok(index: int, ttft: float, tokens: int, e2e: float, itl: tuple[float, ...] = ()) -> RequestRecord:
    return RequestRecord(index, 0.0, ttft, itl, e2e, tokens, 10, tokens, None, None, 200)


def failed(index: int, kind: ErrorKind, detail: str = "x") -> RequestRecord:
    return RequestRecord(index, 0.0, None, (), 0.5, None, None, 0, kind, detail, None)


def rounds(label: str, tokens_per_s: list[float], tokens: int = 100) -> list[RoundMeasurement]:
    """One round per throughput figure: one request of ``tokens`` tokens, with the duration to match."""
    return [
        RoundMeasurement(label, r, r % 2, (ok(0, 0.1, tokens, 1.0),), tokens / tps, NO_METRICS, NO_METRICS)
        for r, tps in enumerate(tokens_per_s)
    ]


def test_percentile_interpolates_linearly_like_numpy():
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 90) == pytest.approx(7.6)  # numpy.percentile(values, 90)
    assert percentile(values, 99) == pytest.approx(9.76)
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 50) is None
    assert percentiles([]).p50 is None


def test_server_result_counts_only_successful_requests_for_throughput():
    records = (
        ok(0, 0.10, 32, 1.0, (0.03,) * 31),
        ok(1, 0.30, 32, 2.0, (0.05,) * 31),
        failed(2, ErrorKind.STALLED_STREAM, "the stream stopped after 3 chunks"),
        failed(3, ErrorKind.STALLED_STREAM, "another"),
        failed(4, ErrorKind.HTTP_STATUS, "HTTP 400: too long"),
    )
    m = RoundMeasurement("A", 0, 0, records, 4.0, NO_METRICS, NO_METRICS)
    s = server_result("A", "http://127.0.0.1:1", "m", [m])
    assert (s.requests, s.errors, s.output_tokens) == (5, 3, 64)
    assert s.output_tokens_per_s == 16.0
    assert s.requests_per_s == 0.5
    assert s.errors_by_kind == {"http-status": 1, "stalled-stream": 2}
    assert s.error_examples["stalled-stream"] == "the stream stopped after 3 chunks"
    assert s.ttft_s.p50 == pytest.approx(0.2)
    assert s.tpot_s.p50 == pytest.approx(((1.0 - 0.1) / 31 + (2.0 - 0.3) / 31) / 2)
    assert s.itl_s.p50 == pytest.approx(0.04)
    assert s.spec is None and s.spec_note is not None
    assert len(s.distributions.ttft_s) == 51


@pytest.mark.parametrize(
    ("ratios", "outcome"),
    [
        ([0.74, 0.88, 0.91, 0.98], Outcome.SLOWER),  # docs/engine-facts.md, temperature 1.0
        ([2.38, 1.44, 1.46, 2.11], Outcome.FASTER),  # docs/engine-facts.md, temperature 0
        ([0.85, 3.03], Outcome.NO_CLEAR_DIFFERENCE),  # the same pair, two single rounds that disagree
        ([0.97, 1.02, 0.99], Outcome.NO_CLEAR_DIFFERENCE),
        ([1.0, 1.2], Outcome.NO_CLEAR_DIFFERENCE),  # touching 1.0 is not clear either
        ([1.01, 1.01, 1.015], Outcome.NO_CLEAR_DIFFERENCE),  # all within 2 %: a server against itself
        ([1.01, 1.05], Outcome.FASTER),
        ([0.66], Outcome.INCONCLUSIVE),
        ([0.9, None], Outcome.INCONCLUSIVE),
    ],
)
def test_outcome_needs_every_round_on_one_side_of_one(ratios, outcome):
    assert outcome_of(ratios) is outcome


def _spec_round(label: str, tps: list[float]) -> list[RoundMeasurement]:
    """Rounds whose /metrics show speculation: 3 drafts of 3 tokens, 1 accepted (11 % acceptance)."""
    from hangwatch.collect.prometheus import parse

    def text(d: int, dt: int, a: int) -> str:
        return (
            f"vllm:spec_decode_num_drafts_total {d}.0\nvllm:spec_decode_num_draft_tokens_total {dt}.0\n"
            f"vllm:spec_decode_num_accepted_tokens_total {a}.0\n"
        )

    out = []
    for m in rounds(label, tps):
        before, after = parse(text(0, 0, 0)), parse(text(3, 9, 1))
        out.append(RoundMeasurement(m.label, m.round, m.position, m.records, m.duration_s, before, after))
    return out


def test_verdict_names_speculative_decoding_and_its_acceptance():
    plain = server_result("A", "http://127.0.0.1:1", "m", rounds("A", [100, 100, 100, 100]))
    spec = server_result("B", "http://127.0.0.1:2", "m", _spec_round("B", [74, 88, 91, 98]))
    c = compare(plain, spec)
    assert c.outcome is Outcome.SLOWER
    assert c.output_tokens_per_s_ratio == pytest.approx(4 / (1 / 0.74 + 1 / 0.88 + 1 / 0.91 + 1 / 0.98))
    assert [r.output_tokens_per_s_ratio for r in c.rounds] == pytest.approx([0.74, 0.88, 0.91, 0.98])
    assert (c.output_tokens_per_s_spread.low, c.output_tokens_per_s_spread.high) == pytest.approx(
        (0.74, 0.98)
    )
    assert c.verdict.startswith("speculative decoding is slower than the plain server: 0.87x output tokens/s")
    assert "(0.74-0.98x over 4 rounds) at 11 % acceptance" in c.verdict


def test_verdict_is_said_from_the_speculative_side_when_it_is_the_first_server():
    spec = server_result("A", "http://127.0.0.1:1", "m", _spec_round("A", [100, 100, 100]))
    plain = server_result("B", "http://127.0.0.1:2", "m", rounds("B", [50, 60, 55]))
    c = compare(spec, plain)
    assert c.outcome is Outcome.SLOWER  # B (plain) is slower than A ...
    assert c.verdict.startswith(
        "speculative decoding is faster than the plain server"
    )  # ... said from A's side
    assert "(1.67-2.00x over 3 rounds)" in c.verdict


def test_verdict_says_no_clear_difference_when_rounds_straddle_one():
    a = server_result("A", "http://127.0.0.1:1", "m", rounds("A", [100, 100]))
    b = server_result("B", "http://127.0.0.1:2", "m", rounds("B", [85, 303]))
    c = compare(a, b)
    assert c.outcome is Outcome.NO_CLEAR_DIFFERENCE
    assert c.verdict.startswith("no clear difference: B ran at")
    assert "single rounds range 0.85-3.03x over 2 rounds" in c.verdict


def test_one_round_is_not_a_verdict():
    a = server_result("A", "http://127.0.0.1:1", "m", rounds("A", [100]))
    b = server_result("B", "http://127.0.0.1:2", "m", rounds("B", [66]))
    c = compare(a, b)
    assert c.outcome is Outcome.INCONCLUSIVE
    assert c.verdict.startswith("one round only: B ran at 0.66x A's output tokens/s")


def test_a_server_with_no_output_gives_no_comparison():
    a = server_result("A", "http://127.0.0.1:1", "m", rounds("A", [100, 100]))
    dead = [RoundMeasurement("B", 0, 1, (failed(0, ErrorKind.REFUSED),), 0.1, NO_METRICS, NO_METRICS)]
    b = server_result("B", "http://127.0.0.1:2", "m", dead)
    c = compare(a, b)
    assert c.output_tokens_per_s_ratio == 0.0
    assert c.verdict == "no comparison: B produced no output tokens in a round (1 of 1 requests failed)"
