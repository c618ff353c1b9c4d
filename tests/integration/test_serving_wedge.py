"""A server that wedges while serving, seen without the engine's word: its /health stays 200, its gauges
stay at 0 (vLLM publishes them only after a step), and requests wait for an answer that never comes.

The stub (tests/programs/stub_openai.py ``--wedge-after N``) answers /health, /v1/models and /metrics
and never answers a completion after the first N. Requests come from hangwatch's own one-token
completion (run's default), from clients of the test's own (loopback), or from nowhere (an idle
server, which is healthy however long it idles).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

import side_by_side
from hwrun import Outcome
from hwrun import assert_all_gone
from hwrun import hangwatch_argv
from hwrun import program
from hwrun import run_hangwatch
from proc_helpers import free_port
from proc_helpers import kill_tree
from proc_helpers import spawn
from proc_helpers import wait_for_file
from proc_helpers import wait_until

pytestmark = pytest.mark.timeout(150)
STALL = 8


def _stub(port: int, *extra: str) -> list[str]:
    return program("stub_openai", "--port", str(port), *extra)


def _client(port: int) -> socket.socket:
    """A client of our own: one non-streamed completion request, left waiting for its answer."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    body = json.dumps({"model": "stub-model", "prompt": "hi", "max_tokens": 4}).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    sock.sendall(head.encode() + body)
    return sock


def _health_ok(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def test_run_sees_a_wedge_through_its_own_request(hw, tmp_path):
    port = free_port()
    out = hw(
        "run", "--quiet", "--engine", "vllm", "--stall-after", str(STALL),
        "--ready-url", f"http://127.0.0.1:{port}/health", "--",
        *_stub(port, "--wedge-after", "0"),
    )  # fmt: skip
    v = out.verdict
    assert out.rc == 3, v
    assert v["state"] == "stalled" and v["summary"].startswith("stalled while serving"), v
    assert any("own one-token completion" in e and "pending" in e for e in v["evidence"]), v["evidence"]
    ready_at = next(p["start"] for p in out.report["phases"] if p["name"] == "ready")
    assert out.report["duration_s"] - ready_at <= STALL + 5, (ready_at, out.report["duration_s"])
    assert any("one-token completion(s) of its own" in n for n in out.report["notes"]), out.report["notes"]
    assert_all_gone(out.report)


def test_run_sees_clients_waiting_without_its_own_request(tmp_path):
    """``--no-own-request``: the clients' connections, read from the kernel, are the witness."""
    port = free_port()
    report = tmp_path / "report.json"
    argv = hangwatch_argv(
        "run", "--quiet", "--engine", "vllm", "--no-own-request", "--stall-after", str(STALL),
        "--ready-url", f"http://127.0.0.1:{port}/health", "--report-json", str(report),
        "--run-dir", str(tmp_path / "run"), "--", *_stub(port, "--wedge-after", "0"),
    )  # fmt: skip
    with ExitStack() as stack:
        proc = stack.enter_context(spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        wait_until(lambda: _health_ok(port), 60, what="the stub to serve")
        time.sleep(2)  # hangwatch has seen it ready
        clients = [_client(port) for _ in range(2)]
        for c in clients:
            stack.callback(c.close)
        sent = time.monotonic()
        proc.wait(timeout=STALL + 30)
        waited = time.monotonic() - sent
    data = json.loads(report.read_text())
    v = data["verdict"]
    assert proc.returncode == 3, v
    assert v["summary"].startswith("stalled while serving"), v
    assert any("2 client connections" in e and "no answer" in e for e in v["evidence"]), v["evidence"]
    assert not any("own one-token" in n for n in data["notes"]), "--no-own-request sends nothing"
    assert waited <= STALL + 5 + 2, waited


def test_an_idle_server_is_healthy_however_long_it_idles(tmp_path):
    port = free_port()
    report = tmp_path / "report.json"
    argv = hangwatch_argv(
        "run", "--quiet", "--engine", "vllm", "--stall-after", "4",
        "--ready-url", f"http://127.0.0.1:{port}/health", "--report-json", str(report),
        "--run-dir", str(tmp_path / "run"), "--", *_stub(port),
    )  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        wait_until(lambda: _health_ok(port), 60, what="the stub to serve")
        time.sleep(14)  # three windows of silence
        assert proc.poll() is None, "an idle server is healthy: no verdict"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        kill_tree(proc)
    data = json.loads(report.read_text())
    assert proc.returncode == 0, data["verdict"]  # stopped while serving healthily
    assert data["verdict"]["state"] == "ready" and "then serving until" in data["verdict"]["summary"], data
    # hangwatch's own request was answered: the server was asked, and answered.
    assert any("HTTP 200" in n for n in data["notes"] if "of its own" in n), data["notes"]


def test_attach_sees_clients_waiting_and_sends_nothing_of_its_own(hw, tmp_path):
    port = free_port()
    ready = tmp_path / "ready"
    log = (tmp_path / "stub.log").open("w")
    with spawn(
        _stub(port, "--wedge-after", "0", "--ready-file", str(ready)), stdout=log, stderr=subprocess.STDOUT
    ) as stub:
        wait_for_file(ready, 30, stub)
        attach = subprocess.Popen(
            hangwatch_argv(
                "attach", "--pid", str(stub.pid), "--engine", "vllm", "--window", "40", "--stall-after", str(STALL),
                "--ready-url", f"http://127.0.0.1:{port}/health", "--quiet", "--report-json", str(tmp_path / "r.json"),
            ),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        try:
            time.sleep(3)
            clients = [_client(port) for _ in range(3)]
            attach.wait(timeout=40 + 10)
        finally:
            kill_tree(attach)
        for c in clients:
            c.close()
        assert stub.poll() is None, "attach is read-only: the server still runs"
    log.close()
    data = json.loads((tmp_path / "r.json").read_text())
    v = data["verdict"]
    assert attach.returncode == 3, v
    assert v["summary"].startswith("stalled while serving"), v
    assert any("3 client connections" in e for e in v["evidence"]), v["evidence"]
    assert not any("of its own" in n for n in data["notes"]), data["notes"]
    assert sys.executable  # the CLI ran under this interpreter


def _run_wedged(port: int, server: list[str], folder: Path) -> Outcome:
    """``hangwatch run`` on a one-process server that wedges on hangwatch's own request."""
    return run_hangwatch(
        ["run", "--quiet", "--engine", "vllm", "--stall-after", str(STALL),
         "--ready-url", f"http://127.0.0.1:{port}/health", "--", *server],
        folder,
        env=side_by_side.own_state(folder),
    )  # fmt: skip


def _wedged_alone(out: Outcome) -> dict[str, Any]:
    """Stalled while serving, the server alone named, nothing left behind. The verdict, for the caller's
    own checks."""
    v = out.verdict
    assert out.rc == 3, v
    assert v["state"] == "stalled" and v["summary"].startswith("stalled while serving"), v
    pids = [p["pid"] for p in out.report["processes"]]
    assert len(pids) == 1 and v["culprits"] == pids, (v, out.report["processes"])  # the server, alone
    assert_all_gone(out.report)
    return dict(v)


def _loop_blocked(how: str, folder: Path) -> Outcome:
    port = free_port()
    return _run_wedged(port, _stub(port, "--block-loop-after", "0", "--block-how", how), folder)


def _handler_wedged(wedge: str, folder: Path) -> Outcome:
    port = free_port()
    return _run_wedged(port, program("threaded_server", "--port", str(port), "--wedge", wedge), folder)


@pytest.fixture(scope="module")
def loops_blocked(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Outcome | Exception]:
    """The blocked loops side by side: each server is watched to ready, then for the 8 s window, about 17 s
    each one after another. Nothing here measures time; the spinning one only loads the others' watchers."""
    hows = side_by_side.selected(
        request, "test_a_server_whose_loop_is_blocked_is_named_by_the_requests_it_leaves_unread", "how"
    )
    return side_by_side.run_family(tmp_path_factory, hows, _loop_blocked)


@pytest.fixture(scope="module")
def handlers_wedged(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Outcome | Exception]:
    """The thread-per-request servers side by side, as ``loops_blocked``."""
    wedges = side_by_side.selected(
        request, "test_a_thread_per_request_server_is_named_by_the_handler_that_never_returns", "wedge"
    )
    return side_by_side.run_family(tmp_path_factory, wedges, _handler_wedged)


@pytest.mark.parametrize("how", ["pipe", "event", "spin"])
def test_a_server_whose_loop_is_blocked_is_named_by_the_requests_it_leaves_unread(loops_blocked, how):
    """The handler of hangwatch's own request blocks the loop: in a bare read of a pipe (its frames look
    like a receive), an Event, or a spin. The probes and requests that follow sit unread in the kernel's
    queues, which names the server as the one not reading, whatever it is parked in."""
    v = _wedged_alone(side_by_side.outcome(loops_blocked, how))
    assert "unread in the kernel" in v["summary"], v


@pytest.mark.parametrize("wedge", ["event", "lock", "spin"])
def test_a_thread_per_request_server_is_named_by_the_handler_that_never_returns(handlers_wedged, wedge):
    """http.server's ThreadingHTTPServer: the completion handler's thread waits on an Event nobody sets,
    on a lock a background thread holds forever, or spins, while the main thread keeps accepting and
    /health stays 200. Beside them a housekeeping thread on a timer and a pool's idle worker, which are
    no wedge. The requests are in the handler's thread: its process is the culprit, that thread the
    place."""
    v = _wedged_alone(side_by_side.outcome(handlers_wedged, wedge))
    assert "process_request_thread) is " + ("spinning" if wedge == "spin" else "stuck") in v["summary"], v
    assert "_wedge" in v["summary"] and "pool_0" not in v["summary"] and "housekeeping" not in v["summary"], v
