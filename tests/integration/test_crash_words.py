"""What a crash or a stall says when nothing names a cause: the last words quoted, next steps that fit
(a rejected command line; a native crash), and what the tree's listening sockets say."""

from __future__ import annotations

import sys

import pytest

from hwrun import program
from proc_helpers import free_port

pytestmark = pytest.mark.timeout(120)


def test_a_rejected_command_line_is_said_so_with_its_words(hw, tmp_path):
    script = tmp_path / "cli.py"
    script.write_text(
        "import argparse\np = argparse.ArgumentParser()\np.add_argument('--port')\np.parse_args()\n"
    )
    out = hw("run", "--quiet", "--no-doctor", "--", sys.executable, str(script), "--prot", "8000")
    v = out.verdict
    assert v["state"] == "crashed" and "command line was rejected" in v["summary"], v
    assert "unrecognized arguments: --prot 8000" in v["summary"]
    assert any("usage:" in e for e in v["evidence"]), v["evidence"]
    assert v["next_steps"] and "usage error" in v["next_steps"][0] and "stacks" not in v["next_steps"][0]


def test_a_native_crash_quotes_its_last_words_and_points_at_faulthandler(hw, tmp_path):
    script = tmp_path / "segv.py"
    script.write_text("import ctypes\nprint('about to crash', flush=True)\nctypes.string_at(0)\n")
    out = hw("run", "--quiet", "--no-doctor", "--", sys.executable, str(script))
    v = out.verdict
    assert v["state"] == "crashed" and "SIGSEGV" in v["summary"] and "native crash" in v["summary"], v
    assert any("about to crash" in e for e in v["evidence"]), v["evidence"]
    assert "PYTHONFAULTHANDLER=1" in v["next_steps"][0]
    assert "waits for it" not in v["summary"]  # there is no rest of the tree


def test_an_idle_listening_server_without_a_readiness_rule_is_said_ready_and_idle(hw):
    # Issue 24: once said "likely healthy" in a stall verdict that stopped it; an idle server is ready.
    port = free_port()
    out = hw(
        "run", "--quiet", "--no-doctor", "--until-ready", "--stall-after", "5", "--",
        *program("healthy_server", "--port", str(port), "--load-seconds", "0.5"),
    )  # fmt: skip
    v = out.verdict
    assert (v["state"], v["cause"]) == ("ready", "idle"), v
    assert f"listens on port {port}" in v["summary"] and v["decided_by"][0] == "ready:idle-server", v


def test_a_probe_on_the_wrong_port_gets_a_hint(hw):
    port, wrong = free_port(), free_port()
    out = hw(
        "run", "--quiet", "--no-doctor", "--stall-after", "5", "--ready-url", f"http://127.0.0.1:{wrong}/health",
        "--", *program("healthy_server", "--port", str(port), "--load-seconds", "0.5"),
    )  # fmt: skip
    v = out.verdict
    assert any(
        f"nothing listens on port {wrong}" in e and f"listens on {port}" in e for e in v["evidence"]
    ), v
