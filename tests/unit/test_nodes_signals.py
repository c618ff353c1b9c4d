"""GPU readings and probe results in the node bundle, and SGLang's dummy health server never counted.

NVML is faked through the same interface as the real one (tests/fakes/fake_pynvml.py, behind
``NvmlGpuSource``). The health servers are real HTTP servers on loopback: one that answers like SGLang's
``launch_dummy_health_check_server`` (``/health`` 200, nothing else: 404), one like the real server
(``/v1/models`` 200 too). The "engine" is a sleeping process whose command line is SGLang's.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from fakes.fake_pynvml import FakeGpu
from fakes.fake_pynvml import FakeNvml
from hangwatch.analyse.nodes import KEY_STRIDE
from hangwatch.analyse.nodewatch import GPU_STRIDE
from hangwatch.analyse.nodewatch import NodeRounds
from hangwatch.collect.nvml import NvmlGpuSource
from hangwatch.engines.sglang import dummy_health_reason
from hangwatch.model.nodes import CollectMode
from hangwatch.model.nodes import NodeOutcome
from hangwatch.model.nodes import NodeResult
from hangwatch.model.samples import ProbeOutcome
from hangwatch.nodes import codec
from hangwatch.nodes.collector import CollectOptions
from hangwatch.nodes.collector import collect


def _server(real: bool) -> tuple[http.server.ThreadingHTTPServer, threading.Thread]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path in ("/health", "/health_generate", "/ping") or (real and self.path == "/v1/models")
            self.send_response(200 if ok else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


@pytest.fixture(params=["dummy", "real"])
def sglang_node(request: pytest.FixtureRequest) -> Iterator[tuple[str, int, int]]:
    """(kind, an SGLang-like launcher of node rank 1 or 0, its port) with the matching health server."""
    kind = request.param
    server, thread = _server(real=kind == "real")
    port = server.server_address[1]
    rank = "1" if kind == "dummy" else "0"
    # Started through a shell that exits at once: the collector never selects its own children.
    argv = [sys.executable, "-c", "import time; time.sleep(60)", "-m", "sglang.launch_server", "--nnodes", "2",
            "--node-rank", rank, "--port", str(port), "--hw-test-sglang-node"]  # fmt: skip
    shell = subprocess.run(
        ["sh", "-c", 'exec "$@" >/dev/null 2>&1 </dev/null & echo $!', "sh", *argv],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    pid = int(shell.stdout.split()[0])
    try:
        yield kind, pid, port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # the one process this fixture started, by its pid
        server.shutdown()
        thread.join()
        server.server_close()


def test_the_bundle_carries_the_nodes_gpu_readings_through_the_same_gpu_source() -> None:
    nvml = FakeNvml([FakeGpu(util=97, processes=[(4242, 3 << 30)])])
    bundle = collect(
        CollectOptions(match="never-matches-zq", mode=CollectMode.CENSUS, every_s=0.0),
        gpu=NvmlGpuSource(nvml),
    )
    back = codec.decode(codec.encode(bundle))
    assert back.gpu is not None and back.gpu == bundle.gpu
    (gpu,) = back.gpu.gpus
    assert gpu.util_pct == 97.0 and gpu.name == "NVIDIA H200"
    assert [(p.pid, p.used_bytes) for p in back.gpu.processes] == [(4242, 3 << 30)]
    # A node without NVML says why, in the sample: evidence, not an error of the collector.
    none = collect(
        CollectOptions(match="never-matches-zq", mode=CollectMode.CENSUS, every_s=0.0),
        gpu=NvmlGpuSource(FakeNvml([])),
    )
    assert none.gpu is not None and "no GPU" in (none.gpu.unavailable or "")


def test_sglangs_dummy_health_server_is_recognised_on_the_node_and_never_joins_the_tick(
    sglang_node: tuple[str, int, int],
) -> None:
    kind, _proc, port = sglang_node
    bundle = collect(
        CollectOptions(match="--hw-test-sglang-node", mode=CollectMode.CENSUS, every_s=0.0, engine="sglang")
    )
    (probe,) = codec.decode(codec.encode(bundle)).probes
    assert probe.probe.url == f"http://127.0.0.1:{port}/health"
    assert probe.probe.outcome is ProbeOutcome.HTTP and probe.probe.status == 200
    rounds = NodeRounds(["n1"])
    tick = rounds.tick(5.0, [NodeResult("n1", NodeOutcome.OK, "", bundle, 0, 0)])
    if kind == "dummy":
        assert probe.node_rank == 1
        assert probe.dummy is not None and "dummy health server" in probe.dummy and "404" in probe.dummy
        assert tick.probes == ()  # a 200 that says nothing: neither readiness nor progress
        assert any("left out" in e and "dummy" in e for e in rounds.events())
    else:
        assert probe.node_rank == 0 and probe.dummy is None
        (kept,) = tick.probes
        assert kept.status == 200 and kept.t == 5.0  # on the controller's clock


def test_the_dummy_rule_goes_by_behaviour_first() -> None:
    argv = ("python", "-m", "sglang.launch_server", "--node-rank", "0")
    # A server with no API route is the dummy, whatever the command line says (a config file can set it).
    assert dummy_health_reason(argv, 200, 404) is not None
    assert dummy_health_reason(argv, 200, 200) is None
    # Unreachable /v1/models: the node rank alone decides.
    assert dummy_health_reason(("sglang", "--node-rank", "2"), 200, None) is not None
    assert dummy_health_reason(("sglang", "--node-rank", "2"), 503, 404) is None  # not a 200: not a dummy


def test_gpus_of_several_nodes_are_renumbered_and_named_with_their_node() -> None:
    source = NvmlGpuSource(FakeNvml([FakeGpu(processes=[(7, 1 << 30)]), FakeGpu()]))
    options = CollectOptions(match="never-matches-zq", mode=CollectMode.CENSUS, every_s=0.0)
    a, b = collect(options, gpu=source), collect(options, gpu=source)
    rounds = NodeRounds(["n1", "n2"])
    tick = rounds.tick(1.0, [NodeResult(h, NodeOutcome.OK, "", x, 0, 0) for h, x in (("n1", a), ("n2", b))])
    assert tick.gpu is not None
    host = a.node.hostname
    labels = [rounds.nodes[0].label, rounds.nodes[1].label]
    assert [g.index for g in tick.gpu.gpus] == [
        GPU_STRIDE,
        GPU_STRIDE + 1,
        2 * GPU_STRIDE,
        2 * GPU_STRIDE + 1,
    ]
    assert tick.gpu.gpus[0].name.startswith(f"{labels[0]}:") and host
    assert {p.pid for p in tick.gpu.processes} == {KEY_STRIDE + 7, 2 * KEY_STRIDE + 7}


def test_the_stacks_report_shows_each_nodes_gpus_and_probe() -> None:
    from dataclasses import replace

    from hangwatch.analyse.nodes import report_of
    from hangwatch.model.nodes import NodeProbe
    from hangwatch.model.samples import ProbeResult
    from hangwatch.render.nodes_text import nodes_text

    nvml = FakeNvml([FakeGpu(util=97, processes=[(4242, 3 << 30)]), FakeGpu(util=100)])
    options = CollectOptions(match="never-matches-zq", mode=CollectMode.CENSUS, every_s=0.0)
    bundle = collect(options, gpu=NvmlGpuSource(nvml))
    dummy = "SGLang's dummy health server (node rank 1: /health always 200, /v1/models 404)"
    probe = NodeProbe(ProbeResult(0.0, "http://127.0.0.1:30000/health", ProbeOutcome.HTTP, 200), 1, dummy)
    bundle = replace(bundle, probes=(probe,))
    text = nodes_text(report_of([NodeResult("n2", NodeOutcome.OK, "", bundle, 0.0, 1.0)], "--match x"))
    assert "  gpus: 2 GPUs: util 97-100 %" in text
    assert f"  probe: http://127.0.0.1:30000/health: HTTP 200 ({dummy})" in text


def test_the_stacks_across_nodes_say_which_rule_decided() -> None:
    """As a run's verdict does: `decided by` (and, with no cause, the closest rules)."""
    import json
    from dataclasses import asdict

    from hangwatch.analyse.nodes import report_of
    from hangwatch.model.rulebook import known
    from hangwatch.render.nodes_text import nodes_text

    options = CollectOptions(match="never-matches-zq", mode=CollectMode.CENSUS, every_s=0.0)
    bundle = collect(options, gpu=NvmlGpuSource(FakeNvml([])))
    report = report_of([NodeResult("n2", NodeOutcome.OK, "", bundle, 0.0, 1.0)], "--match x")
    assert report.diagnosis.decided_by and all(known(r) for r in report.diagnosis.decided_by)
    text = nodes_text(report)
    assert f"  decided by: {' > '.join(report.diagnosis.decided_by)}" in text, text
    assert json.loads(json.dumps(asdict(report), default=str))["diagnosis"]["decided_by"]
