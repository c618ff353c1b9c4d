"""Ranks under ``torch.multiprocessing.spawn`` (nothing names them: no title, no RANK), on shapes the
rules were not written for (issue 23): a rank SIGKILLed (the killed rank is the cause, not the launcher
whose exception reports it), a rank waiting in ``queue.Queue.get`` for its own stuck loader thread while
its peer waits in the all-reduce (a wait of its own, not "waiting for work"), and a rank building tables
for 25 s while its peer waits for it (work: never stalled)."""

from __future__ import annotations

import pytest

from hwrun import assert_all_gone
from hwrun import program

pytestmark = [pytest.mark.timeout(180), pytest.mark.torch]


def _ranks(report: dict) -> list[int]:  # type: ignore[type-arg]
    """The two ranks: the launcher's children that are not multiprocessing's resource tracker."""
    root = min(p["pid"] for p in report["processes"])
    children = [p for p in report["processes"] if p["ppid"] == root]
    return sorted(p["pid"] for p in children if "resource_tracker" not in " ".join(p["cmdline"]))


def test_a_rank_killed_under_mp_spawn_is_the_cause_and_its_launchers_exception_the_consequence(hw):
    out = hw("run", "--quiet", "--no-doctor", "--stall-after", "30", "--",
             *program("spawn_job", "--shape", "kill"))  # fmt: skip
    v = out.verdict
    assert (v["state"], v["cause"]) == ("crashed", "dead-peer"), v
    assert v["culprits"] == [_ranks(out.report)[1]], (v, _ranks(out.report))
    assert "consequence" in v["summary"], v["summary"]
    assert_all_gone(out.report)


def test_a_rank_waiting_for_its_own_stuck_loader_is_named_not_idle(hw):
    out = hw("run", "--quiet", "--no-doctor", "--stall-after", "60", "--",
             *program("spawn_job", "--shape", "loader"))  # fmt: skip
    v = out.verdict
    assert (v["state"], v["cause"]) == ("stalled", "collective-wait"), v
    assert v["culprits"] == [_ranks(out.report)[1]], (v, _ranks(out.report))
    assert "Queue.get" in v["summary"], v["summary"]
    assert_all_gone(out.report)


def test_a_rank_working_while_its_peer_waits_for_it_is_never_stalled(hw):
    out = hw("run", "--quiet", "--no-doctor", "--stall-after", "8", "--",
             *program("spawn_job", "--shape", "work", "--seconds", "25"))  # fmt: skip
    v = out.verdict
    assert v["state"] == "exited", v
    assert out.rc == 0 and out.report["duration_s"] >= 24
    assert_all_gone(out.report)
