"""Who is who: a process named by its log lines before it has a title; a forked helper with its parent's
title is not that rank (it would otherwise be blamed as one)."""

from __future__ import annotations

import sys

import pytest

from hwrun import PROGRAMS
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


def test_ranks_a_launch_script_execs_are_named_by_the_environment_the_exec_brings(hw):
    """Each rank is first seen as the shell before `RANK=$r exec python`, whose environment has no RANK:
    read again once it execs (issue 23: the count of ranks in the summary changed from run to run)."""
    out = hw(
        "run", "--quiet", "--no-doctor", "--stall-after", "8", "--",
        str(PROGRAMS / "exec_ranks.sh"), env={"PYTHON": sys.executable},
    )  # fmt: skip
    ranks = sorted(p["rank"] for p in out.report["processes"] if p["role"] == "rank")
    assert ranks == ["0", "1"], out.report["processes"]


def test_a_tree_supervised_after_another_does_not_adopt_the_last_one_leftovers():
    """A subreaper that supervises trees one after another (isolate, bench) keeps the earlier tree's
    orphans out of the next tree: a trial's verdict once blamed the baseline's processes."""
    import json
    import os
    import subprocess
    import sys

    from hwrun import PROGRAMS

    out = subprocess.run(
        [sys.executable, str(PROGRAMS / "adopted_leftovers.py")],
        capture_output=True, text=True, timeout=60, check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["root"] in seen["members"], seen
    assert seen["orphan"] not in seen["members"] and seen["orphan"] not in seen["exits"], seen
