"""``hangwatch run`` against real programs that really progress, hang, crash and stop."""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable
from typing import Any

import pytest

from hwrun import assert_all_gone
from hwrun import program
from proc_helpers import free_port

pytestmark = pytest.mark.timeout(180)


def test_healthy_boot_is_ready_with_probe_history(hw):
    port = free_port()
    out = hw(
        "run",
        "--until-ready",
        "--quiet",
        "--stall-after",
        "10",
        "--ready-url",
        f"http://127.0.0.1:{port}/health",
        "--",
        *program("healthy_server", "--port", str(port), "--load-seconds", "2", "--health-after", "2"),
    )
    assert out.rc == 0, out.stderr
    v = out.verdict
    assert v["state"] == "ready"
    outcomes = [p["outcome"] for p in out.report["probes"]]
    assert outcomes[0] == "refused"  # nothing listens while loading: said, not hidden
    assert {"outcome": "http", "status": 503} in [
        {"outcome": p["outcome"], "status": p["status"]} for p in out.report["probes"]
    ]
    assert out.report["probes"][-1]["status"] == 200
    assert out.report["schema"] == "hangwatch.report/1"
    assert_all_gone(out.report)


def test_silent_cpu_bound_compile_longer_than_window_is_not_stalled(hw):
    port = free_port()
    out = hw(
        "run",
        "--until-ready",
        "--quiet",
        "--stall-after",
        "4",
        "--ready-url",
        f"http://127.0.0.1:{port}/health",
        "--",
        *program("silent_compile", "--seconds", "10", "--port", str(port)),
    )
    assert out.verdict["state"] == "ready", out.verdict
    assert out.rc == 0


def test_slow_weight_loading_seen_only_as_reads_is_not_stalled(hw, tmp_path):
    port = free_port()
    out = hw(
        "run",
        "--until-ready",
        "--quiet",
        "--stall-after",
        "4",
        "--ready-url",
        f"http://127.0.0.1:{port}/health",
        "--",
        *program("slow_loader", "--seconds", "10", "--size-mb", "16", "--port", str(port)),
    )
    assert out.verdict["state"] == "ready", out.verdict
    io_ticks = [
        p for tick in out.report["timeline"] for p in tick["processes"] if p["io_delta_bytes"] > 100_000
    ]
    assert io_ticks, "reads should be visible as I/O progress"


def test_crash_with_traceback(hw):
    out = hw("run", "--quiet", "--stall-after", "20", "--", *program("crash_traceback"))
    assert out.rc == 4
    v = out.verdict
    assert v["state"] == "crashed" and v["cause"] == "exception"
    assert any("RuntimeError" in e for e in v["evidence"]) or "RuntimeError" in v["summary"]


def test_cuda_out_of_memory_message(hw):
    out = hw("run", "--quiet", "--stall-after", "20", "--", *program("cuda_oom"))
    assert out.rc == 4
    assert out.verdict["cause"] == "cuda-oom"


def test_port_already_in_use(hw):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = hw("run", "--quiet", "--stall-after", "20", "--", *program("port_in_use", "--port", str(port)))
    assert out.rc == 4
    assert out.verdict["cause"] == "port-in-use"
    # The advice names the port the bind was refused on, never the placeholder (issue 24 item 9).
    steps = " ".join(out.verdict["next_steps"])
    assert f"sport = :{port}" in steps and "PORT" not in steps, steps


def _bind_refused_then_hang(
    hw: Callable[..., Any], port: int, *extra: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``port_in_use.py --then-hang`` under ``hangwatch run``: stalled, ``port-in-use``, its launcher (the
    root) named as stuck in its shutdown. The verdict and the report, for the caller's own checks.

    15 s of --stall-after: the stacks that name the stuck launcher need captures over time (the first
    after 3 s of quiet, then every 2 s); with 6 s a loaded run was judged on one capture, naming nobody."""
    out = hw(
        "run", "--quiet", "--stall-after", "15", "--",
        *program("port_in_use", "--port", str(port), "--then-hang", *extra),
    )  # fmt: skip
    v = out.verdict
    assert (v["state"], v["cause"]) == ("stalled", "port-in-use"), v
    root = out.report["processes"][0]["pid"]
    assert v["culprits"] == [root], (v, out.report["processes"])
    return dict(v), dict(out.report)


def test_a_bind_error_logged_then_a_hang_is_port_in_use_with_the_stuck_process_named(hw):
    """As SGLang's launcher: uvicorn logs the bind error, and its shutdown joins a thread forever. The
    log says why, the stacks who is stuck: the verdict gives both."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        v, _ = _bind_refused_then_hang(hw, port)
    assert "address already in use" in v["summary"] and "Thread.join" in v["summary"], v
    assert "of this very tree" not in v["summary"], v  # the owner is outside it


def test_a_port_taken_by_a_process_of_the_tree_itself_names_that_process(hw):
    """As SGLang's scheduler taking its launcher's --port for one of its random internal ports: the owner
    is inside the tree, so "a previous server may still run" is not the lead; the verdict names it."""
    port = free_port()
    v, report = _bind_refused_then_hang(hw, port, "--helper-holds-port")
    (helper,) = {p["pid"] for t in report["timeline"] for p in t["processes"] if port in p["listening_ports"]}
    assert f"port {port} is held by" in v["summary"] and f"[{helper}] of this very tree" in v["summary"], v
    assert "healthy idle server" not in v["summary"], v  # its listening port is the one it could not take


def test_rank_sigkilled_while_peer_waits_on_queue(hw, tmp_path):
    out = hw(
        "run",
        "--quiet",
        "--stall-after",
        "30",
        "--",
        *program(
            "dead_peer", "--ranks", "2", "--victim", "1", "--delay", "1", "--ready-file", str(tmp_path / "r")
        ),
    )
    v = out.verdict
    assert out.rc == 4, v
    assert v["state"] == "crashed" and v["cause"] == "dead-peer"
    victim = v["culprits"][0]
    rec = out.process(victim)
    assert rec["exit_code"] == -9  # SIGKILL, read before the launcher could reap it
    assert rec["exit_how"] in ("zombie-stat", "waitpid")
    assert out.report["duration_s"] < 25, (
        "the others wait forever: the verdict must not wait out the stall window"
    )
    assert_all_gone(out.report)


def test_worker_that_stops_itself(hw, tmp_path):
    out = hw(
        "run",
        "--quiet",
        "--stall-after",
        "8",
        "--",
        *program(
            "self_stop", "--ranks", "2", "--victim", "1", "--delay", "1", "--ready-file", str(tmp_path / "r")
        ),
    )
    v = out.verdict
    assert out.rc == 3, v
    assert v["state"] == "stalled" and v["cause"] == "stopped"
    (culprit,) = v["culprits"]
    assert out.process(culprit)["state"] in ("T", "gone")
    # Killed by the clean-up, and the report says so (not "vanished", not 0).
    assert out.process(culprit)["exit_code"] in (-signal.SIGTERM, -signal.SIGKILL)
    assert_all_gone(out.report)  # stopped processes are killed too


def test_server_that_accepts_but_never_answers(hw):
    port = free_port()
    out = hw(
        "run",
        "--quiet",
        "--stall-after",
        "6",
        "--probe-timeout",
        "1",
        "--ready-url",
        f"http://127.0.0.1:{port}/health",
        "--",
        *program("accept_no_answer", "--port", str(port)),
    )
    assert out.rc == 3
    outcomes = {p["outcome"] for p in out.report["probes"]}
    assert "timeout" in outcomes
    assert any("no HTTP answer" in e or "timeout" in e for e in out.verdict["evidence"])


def test_progress_then_silence_with_still_waiting_lines(hw):
    out = hw(
        "run",
        "--quiet",
        "--stall-after",
        "5",
        "--waiting-pattern",
        "No available shared memory broadcast block",
        "--",
        *program(
            "progress_then_hang",
            "--seconds",
            "2",
            "--waiting-every",
            "1",
            "--waiting-line",
            "No available shared memory broadcast block found in 60 seconds.",
        ),
    )
    v = out.verdict
    assert out.rc == 3, v
    assert any("still waiting" in e for e in v["evidence"])
    # Stalled about stall-after seconds after the last real progress, not reset by the waiting lines.
    assert out.report["duration_s"] < 2 + 5 + 4
