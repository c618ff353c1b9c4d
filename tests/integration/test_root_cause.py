"""The first fault in time is the cause: real launchers whose ranks fail in the two orders engines fail in.

``first_death.py`` (tests/programs) plays vLLM's worker SIGKILLed during start-up (the engine core then
raises "Engine core initialization failed") and SGLang's scheduler raising (the launcher then SIGKILLs
the tree), under ``run`` and under ``attach``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hwrun import assert_all_gone
from hwrun import program
from proc_helpers import spawn
from proc_helpers import wait_for_file

pytestmark = pytest.mark.timeout(180)


def _names(report: dict) -> dict[int, str]:
    return {p["pid"]: p["name"] for p in report["processes"]}


def _rank_pids(log: Path) -> dict[str, int]:
    """``rank1 -> pid`` from the launcher's ``ranks up`` line."""
    line = next(x for x in log.read_text().splitlines() if "ranks up:" in x)
    return {k: int(v) for k, v in (part.split("=") for part in line.split("ranks up: ")[1].split(", "))}


def _assert_victim(report: dict, pid: int, title: str) -> None:
    """The victim is named by its title when its status could be read at death; when its parent reaped it
    first (a race no reader can win every time), by its pid, as a member that ended."""
    rec = next(p for p in report["processes"] if p["pid"] == pid)
    if rec["exit_how"] != "vanished":
        assert rec["name"] == title and rec["exit_code"] == -9, rec


def test_kill_then_raise_blames_the_killed_rank_by_its_title(hw, tmp_path):
    out = hw(
        "run", "--quiet", "--stall-after", "30", "--",
        *program("first_death", "--mode", "kill-then-raise", "--delay", "3", "--ready-file", str(tmp_path / "r")),
    )  # fmt: skip
    v = out.verdict
    assert (v["state"], v["cause"]) == ("crashed", "dead-peer"), v
    victim = _rank_pids(tmp_path / "run" / "output.log")["rank1"]
    assert v["culprits"] == [victim], v
    # It set its title right before it died: no tick saw it alive, the name at death is still its title.
    _assert_victim(out.report, victim, "first_death:r1")
    assert "consequence" in v["summary"] and "Engine core initialization failed" in v["summary"], v
    assert_all_gone(out.report)


def test_raise_then_teardown_blames_the_raiser_not_the_killed(hw, tmp_path):
    out = hw(
        "run", "--quiet", "--engine", "sglang", "--stall-after", "30", "--",
        *program(
            "first_death", "--mode", "raise-then-teardown", "--ranks", "3", "--title", "sglang::scheduler_TP",
            "--ready-file", str(tmp_path / "r"),
        ),
    )  # fmt: skip
    v = out.verdict
    assert (v["state"], v["cause"]) == ("crashed", "exception"), v
    # The rank that raised (its lines say TP1), not one of those SIGKILLed after it.
    assert [_names(out.report)[p] for p in v["culprits"]] == ["sglang::scheduler_TP1"], v
    assert "weight shape mismatch" in v["summary"] and "torn down" in v["summary"], v
    assert_all_gone(out.report)


def test_an_untagged_exception_is_blamed_on_who_wrote_it_not_the_first_killed(hw, tmp_path):
    # As SGLang's TP=1 scheduler fails: its traceback names no rank, and its launcher kills a helper of its
    # own first, then the ranks, the raiser last. The bytes each member wrote before its end say who wrote
    # the traceback; the order of the deaths would blame the helper.
    out = hw(
        "run", "--quiet", "--engine", "sglang", "--stall-after", "30", "--",
        *program(
            "first_death", "--mode", "raise-untagged-then-teardown", "--ranks", "2",
            "--title", "sglang::scheduler_TP", "--ready-file", str(tmp_path / "r"),
        ),
    )  # fmt: skip
    v = out.verdict
    assert (v["state"], v["cause"]) == ("crashed", "exception"), v
    raiser = _rank_pids(tmp_path / "run" / "output.log")["rank1"]
    assert v["culprits"] == [raiser], v
    assert "torn down" in v["summary"], v
    assert_all_gone(out.report)


def test_a_rank_killed_quietly_is_not_said_to_have_peers_failing_after_it(hw, tmp_path):
    out = hw(
        "run", "--quiet", "--stall-after", "30", "--",
        *program("first_death", "--mode", "kill-quietly", "--delay", "3", "--ready-file", str(tmp_path / "r")),
    )  # fmt: skip
    v = out.verdict
    # Its parent reaps it at once, often before its status can be read: then it is a member that ended
    # (stalled, dead-peer); when the status was read, a death by SIGKILL (crashed, dead-peer).
    assert v["state"] in ("crashed", "stalled") and v["cause"] == "dead-peer", v
    victim = _rank_pids(tmp_path / "run" / "output.log")["rank1"]
    assert v["culprits"] == [victim], v
    _assert_victim(out.report, victim, "first_death:r1")
    assert "failed after" not in v["summary"] and "consequence" not in v["summary"], v
    assert "wait" in v["summary"], v
    assert out.report["duration_s"] < 20, "nothing can end the wait: no need for the whole window"


def test_attach_kill_then_raise_blames_the_killed_rank(hw, tmp_path):
    ready = tmp_path / "ready"
    log = (tmp_path / "program.log").open("w")
    argv = program("first_death", "--mode", "kill-then-raise", "--delay", "4", "--ready-file", str(ready))
    with spawn(argv, stdout=log, stderr=subprocess.STDOUT) as popen:
        wait_for_file(ready, 60, popen)
        out = hw("attach", "--pid", str(popen.pid), "--window", "30", "--quiet", "--log", log.name)
    log.close()
    v = out.verdict
    assert (v["state"], v["cause"]) == ("crashed", "dead-peer"), v
    victim = _rank_pids(tmp_path / "program.log")["rank1"]
    assert v["culprits"] == [victim], v
    _assert_victim(out.report, victim, "first_death:r1")
