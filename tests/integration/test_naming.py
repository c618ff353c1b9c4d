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


def test_ranks_named_by_their_environment_under_a_launcher_with_the_same_title(hw):
    """torchrun's ranks share the launcher's title (python3): their RANK makes them ranks, not helpers."""
    out = hw(
        "run", "--until-ready", "--quiet", "--ready-pattern", "all ranks up", "--",
        *program("env_ranks", "--ranks", "2"),
    )  # fmt: skip
    assert out.verdict["state"] == "ready", out.verdict
    ranks = sorted((p["role"], p["rank"]) for p in out.report["processes"] if p["role"] == "rank")
    assert ranks == [("rank", "0"), ("rank", "1")], out.report["processes"]
