"""The other side of the spin rule: real slow phases that are work are never called stalled, even when the
window is much shorter than they last and they print nothing (a single long native call, a real
torch.compile with its C++ compiler child, the compile-like workers of silent_compile.py)."""

from __future__ import annotations

import pytest

from hwrun import program
from proc_helpers import free_port

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("what", ["matmul", "compile"])
def test_long_real_work_with_no_log_is_not_stalled(hw, what):
    pytest.importorskip("torch", reason="needs torch's CPU build (pip install torch==2.13.0)")
    out = hw(
        "run", "--until-ready", "--quiet", "--stall-after", "4", "--ready-pattern", "work done", "--",
        *program("long_native_call", "--what", what),
        timeout=220,
    )  # fmt: skip
    v = out.verdict
    assert v["state"] == "ready", v
    # It really outlasted the window: the work took longer than --stall-after with no line printed.
    begin = next(p["start"] for p in out.report["phases"] if p["name"] == "ready")
    assert begin > 4, out.report["phases"]


def test_compile_workers_outlasting_the_window_are_not_stalled(hw):
    port = free_port()
    out = hw(
        "run", "--until-ready", "--quiet", "--stall-after", "4", "--ready-pattern", "compile done", "--",
        *program("silent_compile", "--seconds", "12", "--workers", "2", "--port", str(port)),
    )  # fmt: skip
    assert out.verdict["state"] == "ready", out.verdict
