"""Who is who: a process named by its log lines before it has a title; a forked helper with its parent's
title is not that rank (it would otherwise be blamed as one)."""

from __future__ import annotations

import pytest

from hwrun import program

pytestmark = pytest.mark.timeout(120)


def test_log_prefixes_name_untitled_workers_and_forked_helpers_are_not_ranks(hw):
    pytest.importorskip("setproctitle", reason="titles need setproctitle")
    out = hw(
        "run", "--until-ready", "--quiet", "--engine", "vllm", "--ready-pattern", "all done",
        "--ready-url", "http://127.0.0.1:9/health", "--", *program("log_named", "--seconds", "3"),
    )  # fmt: skip
    assert out.verdict["state"] == "ready", out.verdict
    procs = out.report["processes"]
    named = [p for p in procs if p["name"] == "VLLM::Worker_TP1"]
    assert named and (named[0]["role"], named[0]["rank"]) == ("Worker", "TP1"), procs
    tp0 = [p for p in procs if p["name"] == "VLLM::Worker_TP0"]
    roles = sorted(((p["role"] or ""), (p["rank"] or "")) for p in tp0)
    assert roles == [("", ""), ("Worker", "TP0")], tp0
