"""Renderers of the bench report: exact terminal text, the JSON contract, a self-contained HTML page."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest

from hangwatch.analyse.bench.stats import bench_report
from hangwatch.bench.options import base_url_of
from hangwatch.cli.bench import BenchCommand
from hangwatch.cli.bench import bench_options
from hangwatch.collect.prometheus import parse
from hangwatch.errors import UsageError
from hangwatch.model.bench import BenchReport
from hangwatch.model.bench import Endpoint
from hangwatch.model.bench import ErrorKind
from hangwatch.model.bench import RequestRecord
from hangwatch.model.bench import RoundMeasurement
from hangwatch.model.bench import Workload
from hangwatch.model.metrics import MetricsSnapshot
from hangwatch.render.bench_html import bench_html
from hangwatch.render.bench_json import bench_to_dict
from hangwatch.render.bench_json import write_bench_json
from hangwatch.render.bench_text import bench_text

WORKLOAD = Workload(
    endpoint=Endpoint.COMPLETIONS, model=None, requests=2, duration_s=None, concurrency=2, rate=None, max_tokens=4,
    temperature=1.0, ignore_eos=True, seed=0, rounds=2, warmup=0, prompts="bundled", prompt_count=240,
    request_timeout_s=600.0, idle_timeout_s=60.0,
)  # fmt: skip


def snap(text: str) -> MetricsSnapshot:
    s = parse(text, "http://127.0.0.1:2/metrics")
    assert isinstance(s, MetricsSnapshot)
    return s


def spec_text(drafts: int, tokens: int, accepted: int, pos: tuple[int, int]) -> str:
    return (
        f"vllm:generation_tokens_total {drafts * 2}.0\nvllm:spec_decode_num_drafts_total {drafts}.0\n"
        f"vllm:spec_decode_num_draft_tokens_total {tokens}.0\nvllm:spec_decode_num_accepted_tokens_total {accepted}.0\n"
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {pos[0]}.0\n'
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="1"}} {pos[1]}.0\n'
        "vllm:num_requests_running 2.0\nvllm:num_requests_waiting 0.0\n"
    )


def rec(i: int, ttft: float, e2e: float) -> RequestRecord:
    return RequestRecord(i, 0.0, ttft, (0.01, 0.02, 0.03), e2e, 4, 10, 4)


def report(model: str = "tiny") -> BenchReport:
    plain_metrics = snap("vllm:generation_tokens_total 0.0\n")
    a = [
        RoundMeasurement(
            "A", r, r % 2, (rec(0, 0.020, 0.100), rec(1, 0.030, 0.120)), 0.5, plain_metrics, plain_metrics
        )
        for r in range(2)
    ]
    b = [
        RoundMeasurement(
            "B", r, 1 - r % 2,
            (rec(0, 0.040, 0.200), RequestRecord(1, 0.0, None, (), 1.0, None, None, 0, ErrorKind.STALLED_STREAM, "stopped")),
            1.0, snap(spec_text(10 * r, 30 * r, 3 * r, (2 * r, r))), snap(spec_text(10 * r + 10, 30 * r + 30, 3 * r + 3, (2 * r + 2, r + 1))),
            (snap(spec_text(10 * r + 5, 30 * r + 15, 3 * r + 1, (2 * r + 1, r))),),
        )
        for r in range(2)
    ]  # fmt: skip
    return bench_report(
        WORKLOAD,
        [("A", "http://127.0.0.1:1", model), ("B", "http://127.0.0.1:2", model)],
        {"A": a, "B": b},
        boots={},
        started_at="2026-11-29T09:00:00+00:00",
        version="0.1.0",
        notes=("A: cleanup: stopped 3 processes",),
    )


EXPECTED_TEXT = """\
hangwatch bench: 2 servers, 2 rounds x 2 requests, /v1/completions, max_tokens 4 (ignore_eos), temperature 1, concurrency 2, 240 prompts (bundled), seed 0
                            A                       B
url                         http://127.0.0.1:1      http://127.0.0.1:2
model                       tiny                    tiny
requests (failed)           4 (0)                   4 (2)
output tokens               16                      8
output tokens/s             16.0                    4.0
requests/s                  4.00                    1.00
TTFT ms p50/p90/p99         25.0 / 30.0 / 30.0      40.0 / 40.0 / 40.0
ITL ms p50/p90/p99          20.0 / 30.0 / 30.0      20.0 / 30.0 / 30.0
TPOT ms p50/p90/p99         28.3 / 30.0 / 30.0      53.3 / 53.3 / 53.3
E2E ms p50/p90/p99          110 / 120 / 120         200 / 200 / 200
server: generated tokens    0                       40
server: running/waiting max -                       2 / 0
spec: acceptance rate       none                    10 % (6 of 60)
spec: mean accept length    -                       1.30
spec: per position          -                       0.20 0.10
output tokens/s by round    16 16                   4 4
errors                      none                    stalled-stream 2

B/A output tokens/s: 0.25x (rounds: 0.25, 0.25)
B/A TTFT p50: 1.60x (rounds 1.60-1.60)
B/A ITL p50: 1.00x (rounds 1.00-1.00)
B/A E2E p50: 1.82x (rounds 1.82-1.82)
verdict: speculative decoding is slower than the plain server: 0.25x output tokens/s (0.25-0.25x over 2 rounds) at 10 % acceptance; 2 of 4 requests failed on B
notes:
  - A: the server exposes no speculative-decoding metrics (no vllm:spec_decode_* or sglang:spec_*)
  - B: stalled-stream: stopped
  - A: cleanup: stopped 3 processes"""


def test_terminal_text_exactly():
    assert bench_text(report()) == EXPECTED_TEXT


def test_json_is_the_model_serialised_with_the_contract_keys(tmp_path):
    r = report()
    data = bench_to_dict(r)
    assert data["schema"] == "hangwatch.bench/1"
    s = data["servers"][1]
    for key in (
        "url",
        "requests",
        "errors",
        "output_tokens",
        "output_tokens_per_s",
        "ttft_s",
        "itl_s",
        "e2e_s",
        "spec",
    ):
        assert key in s
    assert set(s["ttft_s"]) == {"p50", "p90", "p99"}
    assert set(s["spec"]) >= {"acceptance_rate", "mean_acceptance_length", "per_position"}
    assert data["servers"][0]["spec"] is None
    assert set(data["comparison"]) >= {"output_tokens_per_s_ratio", "rounds", "verdict"}
    # every key of the model, and nothing else: serialised, not assembled by hand
    assert set(data) == {f.name for f in dataclasses.fields(BenchReport)}
    path = tmp_path / "r.json"
    write_bench_json(r, path)
    assert json.loads(path.read_text()) == data


def test_html_is_self_contained_and_escapes_what_servers_say():
    page = bench_html(report(model='<script>alert("x")</script>'))
    assert page.count("<svg") == 5
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "src=" not in page and "<link" not in page and "@import" not in page
    assert "speculative decoding is slower than the plain server" in page
    assert "Accepted per draft, by position" in page


def parse_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    BenchCommand().prepare_parser(parser)
    return parser.parse_args(list(argv))


def test_options_defaults_and_compare_rounds(tmp_path):
    one = bench_options(parse_args("--url", "http://127.0.0.1:8000/v1"), 10, tmp_path)
    assert one.urls == ("http://127.0.0.1:8000",)
    assert (one.workload.requests, one.workload.concurrency, one.workload.rounds) == (64, 8, 1)
    two = bench_options(
        parse_args("--url", "http://a:1", "--compare", "http://b:2/", "--rate", "5"), 10, tmp_path
    )
    assert two.workload.rounds == 3 and two.workload.concurrency == 256 and two.launch == (None, None)
    launched = bench_options(
        parse_args("--url", "http://a:1", "--compare", "http://b:2", "--launch-a", "vllm serve m --port 1"),
        10,
        tmp_path,
    )
    assert launched.launch == (("vllm", "serve", "m", "--port", "1"), None)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--url", "http://a:1", "--duration", "0"), "--duration 0: must be more than 0 seconds"),
        (("--url", "http://a:1", "--requests", "2", "--duration", "3"), "not both"),
        (("--url", "http://a:1", "--temperature", "-1"), "0 or more"),
        (("--url", "http://a:1", "--launch-a", ""), "empty command"),
        (("--url", "http://a:1", "--report-json", "/no/such/dir/r.json"), "does not exist"),
    ],
)
def test_option_errors_are_usage_errors(tmp_path, argv, message):
    with pytest.raises(UsageError, match=message):
        bench_options(parse_args(*argv), 10, tmp_path)


@pytest.mark.parametrize(
    "url",
    [
        "http://h:1",
        "http://h:1/",
        "http://h:1/v1",
        "http://h:1/v1/",
        "http://h:1/v1/completions",
        "http://h:1/v1/chat/completions",
    ],
)
def test_base_url_of(url):
    assert base_url_of(url) == "http://h:1"


def test_bundled_prompts_load(tmp_path):
    from hangwatch.bench.prompts import load_prompts

    prompts = load_prompts(None)
    assert len(prompts) == 240 and all(p.text for p in prompts)
    path: Path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a", "output_tokens": 3}\n\n{"prompt": "b"}\n')
    assert [p.text for p in load_prompts(path)] == ["a", "b"]
