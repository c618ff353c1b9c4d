"""attach decides a wait nothing can end as run does, and as soon (issue 24, item 8): a real program
whose only thread waits on an Event nobody will set, watched by ``run`` and by ``attach`` with a long
window. One Assessor rule for both: the same verdict, the same rules, well before the window ends."""

from __future__ import annotations

import sys

import pytest

from hwrun import assert_all_gone
from proc_helpers import spawn
from proc_helpers import wait_until

pytestmark = pytest.mark.timeout(150)

# Prints one line, then waits in `threading.Event().wait()`: no timeout, no other thread to set it.
CLOSED_WAIT = [
    sys.executable,
    "-c",
    "import threading; print('hi', flush=True); threading.Event().wait()",
]


def _check(v) -> None:  # type: ignore[no-untyped-def]
    assert (v["state"], v["cause"]) == ("stalled", "wait-cycle"), v
    assert v["decided_by"][:2] == ["stalled:closed-wait", "stacks:wait-cycle"], v
    # Said once, in plain words, naming no flag.
    assert v["summary"].count("can end") == 1 and "--" not in v["summary"], v["summary"]


def test_attach_gives_the_closed_wait_verdict_well_before_its_window_ends(hw, tmp_path):
    log = tmp_path / "out.log"
    with log.open("w") as sink, spawn(CLOSED_WAIT, stdout=sink, stderr=sink) as proc:
        wait_until(lambda: "hi" in log.read_text(), 30, what="the program's first line")
        out = hw("attach", "--pid", str(proc.pid), "--window", "60", "--quiet")
        assert proc.poll() is None  # read-only: left as it was
    _check(out.verdict)
    assert "not waiting out the 60 s stall window" in out.verdict["summary"], out.verdict["summary"]
    assert out.report["duration_s"] < 60, out.report["duration_s"]
    assert out.report["stall_after_s"] == 60


def test_run_gives_the_same_verdict_by_the_same_rules(hw):
    out = hw("run", "--quiet", "--no-doctor", "--stall-after", "30", "--", *CLOSED_WAIT)
    _check(out.verdict)
    assert "not waiting out the 30 s stall window" in out.verdict["summary"], out.verdict["summary"]
    assert out.report["duration_s"] < 30
    assert_all_gone(out.report)
