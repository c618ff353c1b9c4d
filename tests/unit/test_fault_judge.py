"""How the fault matrix judges a cell's report (tests/faults/matrix.py): what it calls right, and the two
latencies it prints (from the fault firing, and for a stall from the tree's last real progress)."""

from __future__ import annotations

import dataclasses
from typing import Any

from faults import matrix


def _report(
    state: str, cause: str, culprits: list[int], last_progress_t: float, end_t: float
) -> dict[str, Any]:
    return {
        "verdict": {
            "state": state,
            "cause": cause,
            "culprits": culprits,
            "summary": "s",
            "phase": "kv_alloc",
        },
        "processes": [
            {"pid": 11, "name": "VLLM::Worker_TP0", "role": "Worker", "rank": "TP0"},
            {"pid": 12, "name": "VLLM::Worker_TP1", "role": "Worker", "rank": "TP1"},
        ],
        "duration_s": end_t,
        "timeline": [{"t": 30.0}, {"t": end_t}, {"t": end_t + 8.0}],  # the last tick: the clean-up's
        "last_progress_t": last_progress_t,
    }


def test_a_stall_is_timed_from_the_last_progress_as_well_as_from_the_fault() -> None:
    """vllm-tp2-TP1-kv_alloc-block-run (2026-12-04): TP0 grew its memory 7 s after TP1 blocked; the verdict
    came 38.4 s after the fault and 31 s after that last progress, within the goal's --stall-after + 2 s."""
    cell = matrix.Cell("vllm", 2, "TP1", "kv_alloc", "block")
    result = matrix.Result(cell.name, dataclasses.asdict(cell.expected()), latency_s=38.4)
    matrix.judge(cell, result, _report("stalled", "unknown", [12], 37.0, 68.0), fired_pid=12)
    assert (result.right, result.quiet_s) == (True, 31.0), result
    assert result.late is not None and "38.4 s > 32 s" in result.late
    assert "(31 s after the last progress)" in matrix.format_table([result])


def test_a_crash_blaming_the_peer_is_wrong_and_has_no_quiet_time() -> None:
    cell = matrix.Cell("vllm", 2, "TP1", "weights", "sigkill")
    result = matrix.Result(cell.name, dataclasses.asdict(cell.expected()), latency_s=5.0)
    matrix.judge(cell, result, _report("crashed", "exception", [11], 20.0, 25.0), fired_pid=12)
    assert not result.right and result.quiet_s is None
    assert any("!= [12]" in why for why in result.why_wrong) and any(
        "exception" in w for w in result.why_wrong
    )
