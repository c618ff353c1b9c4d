"""``hangwatch bench`` end to end on the real CLI, against the stub OpenAI server (tests/programs/stub_openai.py).

Every bad input must end in a clear error and a bounded wall time: no server, a server that accepts and
never answers, a server that is not OpenAI, streams that break in each way. Launched servers must be gone
when hangwatch exits, whatever the way out.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from hangwatch.redact import redact_argv
from hangwatch.supervise.runrecord import read_run_record
from hwrun import PROGRAMS
from hwrun import program
from hwrun import run_hangwatch
from proc_helpers import free_port
from proc_helpers import kill_tree
from proc_helpers import spawn
from proc_helpers import wait_for_file
from proc_helpers import wait_until

pytestmark = pytest.mark.timeout(120)

STUB = str(PROGRAMS / "stub_openai.py")


def hangwatch_bench(*args: str) -> list[str]:
    return [sys.executable, "-m", "hangwatch", "bench", *args]


@contextlib.contextmanager
def stub(tmp_path: Path, *args: str) -> Iterator[str]:
    """The stub on a free port; yields its base URL; the process tree is reaped afterwards."""
    ready = tmp_path / f"stub-{time.monotonic_ns()}.port"
    with spawn([sys.executable, STUB, "--ready-file", str(ready), *args], stdout=subprocess.DEVNULL) as proc:
        port = wait_for_file(ready, timeout=20, popen=proc).strip()
        yield f"http://127.0.0.1:{port}"


def bench(
    tmp_path: Path, *args: str, timeout: float = 90
) -> tuple[int, str, str, dict[str, Any] | None, float]:
    """Run ``hangwatch bench ARGS --report-json``; (rc, stdout, stderr, report, seconds)."""
    started = time.monotonic()
    o = run_hangwatch(["bench", "--run-dir", str(tmp_path / "run"), *args], tmp_path, timeout)
    return o.rc, o.stdout, o.stderr, o.report, time.monotonic() - started


def metrics(url: str) -> dict[str, float]:
    """The test's own reading of /metrics: each sample name (and position label) summed over the rest."""
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})? (\S+)$", line)
        if not m:
            continue
        name = m.group(1)
        pos = re.search(r'position="(\d+)"', m.group(2) or "")
        key = f"{name}[{pos.group(1)}]" if pos else name
        out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def test_plain_vs_speculative_compare_matches_the_servers_own_counters(tmp_path):
    with (
        stub(tmp_path, "--token-interval", "0.004") as plain,
        stub(
            tmp_path,
            "--token-interval",
            "0.004",
            "--spec-tokens",
            "3",
            "--accept",
            "0.8",
            "--engines",
            "2",
            "--seed",
            "3",
        ) as spec,
    ):
        before = metrics(spec)
        html = tmp_path / "bench.html"
        rc, out, err, report, _ = bench(
            tmp_path, "--url", plain, "--compare", spec + "/v1", "--rounds", "3", "--requests", "10",
            "--max-tokens", "24", "--concurrency", "4", "--warmup", "0", "--report-html", str(html),
        )  # fmt: skip
        after = metrics(spec)
    assert rc == 0, err
    assert report is not None and report["schema"] == "hangwatch.bench/1"
    a, b = report["servers"]
    assert (a["requests"], a["errors"], a["output_tokens"]) == (30, 0, 30 * 24)
    assert (b["requests"], b["errors"], b["output_tokens"]) == (30, 0, 30 * 24)
    assert a["spec"] is None and "no speculative-decoding metrics" in a["spec_note"]

    def delta(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    spec_figures = b["spec"]
    drafts, draft_tokens = (
        delta("vllm:spec_decode_num_drafts_total"),
        delta("vllm:spec_decode_num_draft_tokens_total"),
    )
    accepted = delta("vllm:spec_decode_num_accepted_tokens_total")
    assert (spec_figures["drafts"], spec_figures["draft_tokens"], spec_figures["accepted_tokens"]) == (
        drafts,
        draft_tokens,
        accepted,
    )
    assert spec_figures["acceptance_rate"] == pytest.approx(accepted / draft_tokens, abs=1e-6)
    assert spec_figures["mean_acceptance_length"] == pytest.approx(1 + accepted / drafts, abs=1e-6)
    per_pos = [delta(f"vllm:spec_decode_num_accepted_tokens_per_pos_total[{i}]") / drafts for i in range(3)]
    assert spec_figures["per_position"] == pytest.approx(per_pos, abs=1e-6)
    assert (
        b["server_metrics"]["generation_tokens"]
        == b["output_tokens"]
        == delta("vllm:generation_tokens_total")
    )

    c = report["comparison"]
    assert len(c["rounds"]) == 3
    assert c["outcome"] == "faster", c  # 1 + 0.8 + 0.64 + 0.51 tokens per step against 1
    assert c["verdict"].startswith("speculative decoding is faster than the plain server")
    assert f"{c['output_tokens_per_s_ratio']:.2f}x" in c["verdict"]
    assert "verdict: speculative decoding is faster" in out
    page = html.read_text()
    assert page.count("<svg") == 5 and "<script" not in page and "http-equiv" not in page


def test_single_server_with_duration_and_poisson_rate(tmp_path):
    with stub(tmp_path, "--token-interval", "0.002") as url:
        rc, _, err, report, seconds = bench(
            tmp_path, "--url", url, "--duration", "1.5", "--rate", "20", "--max-tokens", "8", "--warmup", "0",
            "--endpoint", "chat", "--seed", "7",
        )  # fmt: skip
    assert rc == 0, err
    s = report["servers"][0]
    assert 10 <= s["requests"] <= 60 and s["errors"] == 0
    assert report["comparison"] is None
    assert report["workload"]["rate"] == 20.0 and report["workload"]["endpoint"] == "chat"
    assert seconds < 30


def test_a_url_with_no_server_is_refused_at_once(tmp_path):
    port = free_port()
    rc, _, err, report, seconds = bench(tmp_path, "--url", f"http://127.0.0.1:{port}", "--requests", "50")
    assert rc == 6, err
    assert "connection refused: nothing listens on the port" in err
    assert "Traceback" not in err
    assert report is None
    assert seconds < 20


@pytest.mark.parametrize("server", ["accept_no_answer", "stub-silent"])
def test_a_server_that_accepts_but_never_answers_times_out_clearly(tmp_path, server):
    ready = tmp_path / "ready"
    port = free_port()
    if server == "accept_no_answer":
        argv = program("accept_no_answer", "--port", str(port), "--ready-file", str(ready))
    else:
        argv = [sys.executable, STUB, "--mode", "silent", "--port", str(port), "--ready-file", str(ready)]
    with spawn(argv, stdout=subprocess.DEVNULL) as proc:
        wait_for_file(ready, timeout=20, popen=proc)
        rc, _, err, _, seconds = bench(tmp_path, "--url", f"http://127.0.0.1:{port}", "--probe-timeout", "2")
    assert rc == 6, err
    assert "connected, but no HTTP answer within 2 s" in err
    assert seconds < 25


def test_servers_that_are_not_openai(tmp_path):
    port = free_port()
    ready = tmp_path / "ready"
    with spawn(program("healthy_server", "--port", str(port), "--load-seconds", "0", "--ready-file", str(ready)),
               stdout=subprocess.DEVNULL) as proc:  # fmt: skip
        wait_for_file(ready, timeout=20, popen=proc)
        rc, _, err, _, _ = bench(tmp_path, "--url", f"http://127.0.0.1:{port}")
    assert rc == 6 and "answered HTTP 404" in err and "not an OpenAI-compatible server" in err
    with stub(tmp_path, "--mode", "not-openai") as url:
        rc, _, err, _, _ = bench(tmp_path, "--url", url)
    assert rc == 6 and "without an OpenAI model list" in err and "It works!" in err


@pytest.mark.parametrize(
    ("mode", "kind", "words"),
    [
        ("malformed", "malformed", "is not JSON"),
        ("no-usage", "no-usage", "without a usage chunk"),
        ("drop", "disconnected", "after 2 chunks"),
        ("error-status", "http-status", "maximum context length is 512"),
        ("json-body", "not-openai", "one JSON body instead of a stream"),
        ("hang-stream", "stalled-stream", "the stream stopped after 2 chunks"),
    ],
)
def test_broken_streams_are_classified_and_bounded(tmp_path, mode, kind, words):
    with stub(tmp_path, "--mode", mode) as url:
        rc, out, err, report, seconds = bench(
            tmp_path,
            "--url",
            url,
            "--requests",
            "40",
            "--concurrency",
            "4",
            "--idle-timeout",
            "1",
            "--warmup",
            "0",
        )
    assert rc == 6, err
    s = report["servers"][0]
    assert set(s["errors_by_kind"]) <= {kind, "cancelled"} and s["errors_by_kind"][kind] >= 1, s[
        "errors_by_kind"
    ]
    assert words in s["error_examples"][kind]
    assert s["aborted"] and "no success" in s["aborted"]
    assert s["requests"] < 40  # stopped after the first wave, not 40 x the idle timeout
    assert seconds < 30
    assert f"{kind}: " in out


def test_usage_errors(tmp_path):
    bad_prompts = tmp_path / "p.jsonl"
    bad_prompts.write_text('{"prompt": "ok"}\n{"text": "no prompt key"}\n')
    cases = [
        (["--url", "http://127.0.0.1:1", "--requests", "0"], "--requests must be a positive number"),
        (["--url", "http://127.0.0.1:1", "--requests", "3", "--duration", "2"], "not both"),
        (["--url", "http://127.0.0.1:1", "--launch-b", "x"], "--launch-b needs --compare"),
        (["--url", "ftp://127.0.0.1:1"], "not an HTTP URL"),
        (["--url", "http://127.0.0.1:1", "--prompts", str(bad_prompts)], 'line 2 has no "prompt" string'),
        (["--url", "http://127.0.0.1:1", "--launch-a", "'unclosed"], "cannot split the command"),
    ]
    for args, message in cases:
        rc, _, err, _, _ = bench(tmp_path, *args)
        assert rc == 2, (args, err)
        assert message in err, (args, err)


def _stub_processes(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE and marker in " ".join(p.info["cmdline"] or []):
                found.append(p)
    return found


def test_launched_servers_are_supervised_benchmarked_and_stopped(tmp_path):
    pa, pb = free_port(), free_port()
    launch_a = f"{sys.executable} {STUB} --port {pa} --boot-seconds 1 --token-interval 0.002"
    launch_b = f"{sys.executable} {STUB} --port {pb} --spec-tokens 2 --accept 0.5 --token-interval 0.002"
    rc, _, err, report, _ = bench(
        tmp_path, "--url", f"http://127.0.0.1:{pa}", "--compare", f"http://127.0.0.1:{pb}",
        "--launch-a", launch_a, "--launch-b", launch_b, "--requests", "8", "--max-tokens", "16", "--rounds", "2",
    )  # fmt: skip
    assert rc == 0, err
    for s, port, launch, label in zip(report["servers"], (pa, pb), (launch_a, launch_b), "AB", strict=True):
        assert s["boot"] is not None and s["boot"]["ready_after_s"] > 0
        assert Path(s["boot"]["log_path"]).read_text().startswith("stub: starting")
        assert json.loads(Path(s["boot"]["report_path"]).read_text())["verdict"]["state"] == "ready"
        assert not _stub_processes(f"--port {port}"), "a launched server outlived hangwatch"
        # Each server has a run directory of its own, with the record `hangwatch cleanup --run` reads.
        record = read_run_record(tmp_path / "run" / f"server-{label}")
        assert record.command == redact_argv(launch.split())  # stored redacted: --token-interval's value too
        assert Path(s["boot"]["log_path"]).parent == tmp_path / "run" / f"server-{label}"
    assert any("cleanup: stopped" in n for n in report["notes"])
    assert "A: ready after" in err


def test_a_launched_server_that_hangs_while_booting_is_a_stall_verdict(tmp_path):
    port = free_port()
    rc, _, err, report, seconds = bench(
        tmp_path, "--url", f"http://127.0.0.1:{port}", "--stall-after", "4",
        "--launch-a", f"{sys.executable} {STUB} --port {port} --boot-hang",
    )  # fmt: skip
    assert rc == 3, err
    assert "server A did not come up: stalled" in err
    assert report is None
    assert seconds < 40
    assert not _stub_processes(f"--port {port}")


def test_a_launched_server_that_crashes_mid_benchmark_stops_it_with_the_crash(tmp_path):
    port = free_port()
    rc, _, err, report, seconds = bench(
        tmp_path, "--url", f"http://127.0.0.1:{port}", "--requests", "400", "--concurrency", "2", "--warmup", "0",
        "--launch-a", f"{sys.executable} {STUB} --port {port} --token-interval 0.01 --die-after 6",
    )  # fmt: skip
    assert rc == 4, err
    s = report["servers"][0]
    assert 6 <= s["requests"] - s["errors"] <= 8
    assert s["requests"] < 400
    assert any("crashed during the benchmark" in n for n in report["notes"]), report["notes"]
    assert seconds < 60


def test_sigterm_stops_the_benchmark_and_the_launched_server(tmp_path):
    port = free_port()
    argv = hangwatch_bench(
        "--run-dir", str(tmp_path / "run"), "--quiet",
        "--url", f"http://127.0.0.1:{port}", "--requests", "100000", "--concurrency", "2",
        "--launch-a", f"{sys.executable} {STUB} --port {port} --token-interval 0.05",
    )  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )

    def streaming() -> bool:
        try:
            return metrics(f"http://127.0.0.1:{port}").get("vllm:generation_tokens_total", 0) > 0
        except OSError:
            return False

    try:
        wait_until(streaming, timeout=60, interval=0.2, what="the launched stub to stream tokens")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        kill_tree(proc)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert not _stub_processes(f"--port {port}")
    assert os.path.exists(tmp_path / "run" / "server-A" / "report.json")
