"""A rank that is not where its group waits for it, in shapes no rule was written for (real gloo ranks).

``gloo_missing_collective.py``: rank 0 waits in ``all_reduce``; rank 1 instead logs a retry loop's
"still waiting ... (attempt N)" every 2 s, or leaves the group without a word (``sys.exit(0)``,
``os._exit(3)``), after which rank 0's gloo raises "Connection closed by peer". Tried on 2026-12-04 before
the rules below: the retry loop's lines kept the tree "progressing" for good, and the peer's exception was
taken for the cause (and once put in the mouth of the rank that left).
"""

from __future__ import annotations

import pytest

from hwrun import assert_all_gone
from hwrun import program

pytestmark = [pytest.mark.timeout(180), pytest.mark.torch]


def _rank_pid(report: dict, title: str) -> int:
    return next(p["pid"] for p in report["processes"] if p["name"] == title)


def _run(hw, tmp_path, elsewhere: str, *extra: str):
    pytest.importorskip("torch", reason="needs torch's CPU build (pip install torch==2.13.0)")
    return hw(
        "run", "--quiet", "--stall-after", "30", "--",
        *program(
            "gloo_missing_collective", "--world-size", "2", "--culprit", "1", "--elsewhere", elsewhere,
            "--ready-file", str(tmp_path / "ready"), *extra,
        ),
    )  # fmt: skip


def test_a_retry_loop_that_logs_is_a_wait_not_progress(hw, tmp_path):
    out = _run(hw, tmp_path, "retry-log")
    v = out.verdict
    assert (v["state"], v["cause"]) == ("stalled", "collective-wait"), v
    assert v["culprits"] == [_rank_pid(out.report, "gloo_rank1")], v
    # Its lines are named for what they are, never "log silent".
    assert any("still waiting" in e and "attempt" in e for e in v["evidence"]), v["evidence"]
    assert not any(e.startswith("log silent") for e in v["evidence"]), v["evidence"]
    # Its lines are no progress: the window counts from before them (stalled within the 30 s window and
    # the start-up, not held off by every line). A retry loop wakes and looks again, so it may end the
    # wait itself: never "nothing inside the tree can end this wait" once the kernel shows it waking
    # (issue 23, 2026-12-04: a poll is never a closed wait; before, this closed in 11 s).
    assert out.report["duration_s"] < 45, out.report["duration_s"]
    if "stall:open-while-it-moves" in v["decided_by"]:
        assert "nothing inside the tree can end" not in v["summary"], v["summary"]
    assert_all_gone(out.report)


@pytest.mark.parametrize(("elsewhere", "status"), [("exit0", "exit code 0"), ("os-exit", "exit code 3")])
def test_a_rank_that_leaves_without_a_word_is_the_cause_and_its_peers_exception_the_consequence(
    hw, tmp_path, elsewhere, status
):
    out = _run(hw, tmp_path, elsewhere)
    v = out.verdict
    assert (v["state"], v["cause"]) == ("crashed", "dead-peer"), v
    leaver = _rank_pid(out.report, "gloo_rank1")
    assert v["culprits"] == [leaver], v
    assert f"gloo_rank1 [{leaver}] {status}" in v["summary"], v
    assert "consequence" in v["summary"] and "Connection closed by peer" in v["summary"], v
    assert "raised" not in v["summary"], v  # the exception is rank 0's, not the leaver's
    assert_all_gone(out.report)


def test_a_rank_gone_cleanly_while_its_peer_waits_in_the_store_is_a_dead_peer(hw, tmp_path):
    # Nothing raises: rank 0 waits for a key of the store it serves itself, which rank 1 would have set.
    # Before, "rendezvous incomplete (the other ranks never checked in)", no culprit, after the window.
    out = _run(hw, tmp_path, "exit0", "--waiters-in", "store")
    v = out.verdict
    assert (v["state"], v["cause"]) == ("stalled", "dead-peer"), v
    leaver = _rank_pid(out.report, "gloo_rank1")
    assert v["culprits"] == [leaver], v
    assert f"gloo_rank1[{leaver}] exit code 0" in v["summary"] and "for it" in v["summary"], v
    assert out.report["duration_s"] < 30, out.report["duration_s"]  # closed: not the whole window
    assert_all_gone(out.report)
