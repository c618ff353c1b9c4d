"""The nodes' logs followed through a watch: the collector's stream sends each census the lines its
logs gained, and the controller reads them as the one-node watch reads its own log.

The collector side runs for real against a real process whose stdout is a file (the way a node's server
is usually started: ``nohup ... > server.log``); the controller side gets bundles built by hand where the
merge's arithmetic is the point, and the whole watch loop runs on the fake fan-out of test_nodes_watch.
"""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from test_nodes_watch import FakeJob
from test_nodes_watch import _bundle
from test_nodes_watch import _watch

from hangwatch import engines
from hangwatch.analyse.nodes import KEY_STRIDE
from hangwatch.analyse.nodewatch import NodeLogs
from hangwatch.analyse.nodewatch import NodeRounds
from hangwatch.model.nodes import LogTail
from hangwatch.model.nodes import NodeOutcome
from hangwatch.model.nodes import NodeProbe
from hangwatch.model.nodes import NodeResult
from hangwatch.model.report import State
from hangwatch.model.samples import ProbeOutcome
from hangwatch.model.samples import ProbeResult
from hangwatch.model.vocabulary import Cause
from hangwatch.nodes import codec
from hangwatch.nodes.collector import FOLLOW_MAX_LINES
from hangwatch.nodes.collector import CollectOptions
from hangwatch.nodes.collector import LogFollow
from hangwatch.nodes.collector import serve_requests
from proc_helpers import kill_tree


@pytest.fixture
def server_with_a_log(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=out)
    try:
        yield proc, log
    finally:
        kill_tree(proc)


def test_each_census_of_a_stream_carries_the_lines_its_logs_gained(
    server_with_a_log: tuple[subprocess.Popen[bytes], Path],
) -> None:
    proc, log = server_with_a_log
    log.write_text("written before the watch: not news\n")

    def requests() -> Iterator[str]:
        yield "census\n"  # the log is followed from here
        with log.open("a") as f:
            f.write("Loading weights took 3.2 s\nHF_TOKEN=hf_abcdefghijklmnopqrstuvwx\n")
        yield "census\n"
        yield "census\n"  # nothing new

    out = io.StringIO()
    serve_requests(CollectOptions(pids=(proc.pid,), every_s=0.0, probe=False), requests(), out)
    first, second, third = (codec.decode(line) for line in out.getvalue().splitlines())
    assert [f.lines for f in first.follow] == []
    (gained,) = second.follow
    assert gained.source.endswith(f"-> {log}") and gained.new_bytes > 0
    assert gained.lines[0] == "Loading weights took 3.2 s"
    assert "hf_abcdefghijklmnopqrstuvwx" not in gained.lines[1]  # redacted on the node
    assert [(f.lines, f.new_bytes) for f in third.follow] == [((), 0)]


def test_a_log_that_floods_is_capped_per_round_and_counted(tmp_path: Path) -> None:
    log = tmp_path / "flood.log"
    log.write_text("")
    follow = LogFollow()
    errors: list = []
    assert follow.read([("flood", log)], errors) == ()
    log.write_text("".join(f"step {i}\n" for i in range(FOLLOW_MAX_LINES + 50)))
    (tail,) = follow.read([("flood", log)], errors)
    assert len(tail.lines) == FOLLOW_MAX_LINES and tail.lines_omitted == 50
    follow.read([("gone", tmp_path / "missing.log")], errors)
    assert [e.stage for e in errors] == ["log"] and errors[0].detail == "gone: No such file or directory"


def _result(host: str, lines: tuple[str, ...], probe_url: str | None = None) -> NodeResult:
    bundle = replace(_bundle(host, 1.0, 1.0, False), follow=(LogTail("server.log", lines, 100),))
    if probe_url is not None:
        probe = ProbeResult(1.0, probe_url, ProbeOutcome.HTTP, 200, None, 0.01)
        bundle = replace(bundle, probes=(NodeProbe(probe, 0, None),))
    return NodeResult(host, NodeOutcome.OK, "", bundle, 0, 0)


def test_a_nodes_lines_name_its_own_pids_and_its_health_probes_are_echoes() -> None:
    logs = NodeLogs(engines.by_name("vllm"))
    results = [
        _result(
            "n1",
            ('INFO:     127.0.0.1:40612 - "GET /health HTTP/1.1" 200 OK',),
            "http://127.0.0.1:8000/health",
        ),
        _result(
            "n2",
            (
                "(Worker_TP2 pid=7) ERROR 12-02 06:40:01 Traceback (most recent call last):",
                "(Worker_TP2 pid=7) RuntimeError: CUDA error: an illegal memory access was encountered",
            ),
        ),
    ]
    tick = NodeRounds(["n1", "n2"]).tick(5.0, results)  # the raw logs, one per node
    assert [(log.source, log.label) for log in tick.logs] == [(0, "n1"), (1, "n2")]
    sample = logs.read(tick)
    assert sample.echo_lines == 1 and sample.progress_lines == 2
    assert (2 * KEY_STRIDE + 7, "Worker_TP2") in sample.named
    assert sample.findings, sample
    assert {f.pid for f in sample.findings} == {2 * KEY_STRIDE + 7}
    assert all(f.line.startswith("n2: ") for f in sample.findings)
    assert sample.last_line is not None and sample.last_line.startswith("n2: ")
    assert {f.cause for f in sample.findings} == {Cause.EXCEPTION}


def test_a_job_whose_only_progress_is_a_nodes_log_is_not_stalled_while_it_prints() -> None:
    """CPU frozen from 5 s, node n2 prints a line every round until 40 s: stalled only 20 s after that."""

    class Printing(FakeJob):
        def _round(self, request: str) -> list[NodeResult]:
            out = super()._round(request)
            if self.now < 40.0 and request == "census":
                line = (f"epoch 1 step {int(self.now)}",)
                out = [
                    replace(r, bundle=replace(r.bundle, follow=(LogTail("train.log", line, 20),)))
                    if r.host == "n2" and r.bundle is not None
                    else r
                    for r in out
                ]
            return out

    job = Printing(progress_until=5.0)
    verdict = _watch(job).run()
    assert verdict.state is State.STALLED, verdict
    assert job.now >= 40.0 + 20.0 - 1, (job.now, verdict.summary)
    silent = FakeJob(progress_until=5.0)
    assert _watch(silent).run().state is State.STALLED
    assert silent.now < 40.0, "without the log the same job is stalled long before"
