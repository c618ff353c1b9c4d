"""Ranks nothing names (no title, no RANK): who is in the group is decided by what they do, not by a name.

``p2p_deadlock.py``: two ranks of ``torch.multiprocessing.spawn`` each in gloo's ``recv`` from the other.
Before, the launcher joining them and its resource tracker were named as ranks that "never entered" the
collective."""

from __future__ import annotations

import pytest

from hwrun import assert_all_gone
from hwrun import program

pytestmark = pytest.mark.timeout(150)


def test_a_p2p_deadlock_of_unnamed_ranks_blames_neither_their_launcher_nor_its_helper(hw, tmp_path):
    out = hw(
        "run", "--quiet", "--stall-after", "60", "--",
        *program("p2p_deadlock", "--ready-file", str(tmp_path / "r")),
    )  # fmt: skip
    v = out.verdict
    assert (v["state"], v["cause"]) == ("stalled", "collective-wait"), v
    launcher = {p["pid"] for p in out.report["processes"] if p["role"] == "main"}
    in_recv = {p["pid"] for p in out.report["processes"] if p["pid"] not in launcher}
    assert launcher and not launcher & set(v["culprits"]), v
    # Every culprit, if any is named, is one of the processes in the recv, not the tracker.
    assert set(v["culprits"]) <= in_recv and "never entered" not in v["summary"], v
    assert "not waiting out" in v["summary"] and out.report["duration_s"] <= 40, v["summary"]
    assert_all_gone(out.report)
