"""End-to-end: a representative subset of the fault matrix (tests/faults/matrix.py), asserted.

Every fault kind (block, spin, sigkill, sigstop, raise), both engines, `run` and `attach` at least once.
The expectations are the matrix's own (written before the cells ran, docs/fault-matrix.md); a failure
here is a verdict bug (or a changed engine), never a flaky harness: the harness says when the fault did
not fire. Cells chosen to fire early (weight loading, SGLang's short boot) so that the whole module
costs about 7 minutes on the 2-core machine (each cell is bounded by its own timeout below).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from faults import matrix

pytestmark = [pytest.mark.slow, pytest.mark.faults]

# Every fault kind and both engines, run and attach, and one wedge while serving: SGLang's TP1 blocked in
# its forward with requests in flight, which its peer's collective closes (8.7-12.6 s after the fault in
# three runs, 2026-12-04). The TP=1 serving wedges wait out the whole window (34-37 s after the fault in
# the full matrix of 2026-12-04, and 82 s in one of five runs on 2026-12-02, when a CPU burst of the
# blocked scheduler's other threads restarted the window): too near this test's sanity bound to assert
# here. The wedge-while-serving rule itself is tested against a stub in tests/integration/test_serving_wedge.py.
SUBSET = [
    "vllm-tp2-TP1-weights-sigstop-run",
    "vllm-tp2-TP1-weights-raise-run",
    "vllm-tp2-TP1-weights-spin-run",
    "vllm-tp2-TP1-weights-sigkill-attach",
    "sglang-tp2-TP1-weights-block-run",
    # Not sglang-tp2-TP1-weights-sigkill-attach: wrong in one run of six (CI, 2026-12-02). TP1's
    # SIGKILL makes TP0 raise 57 ms later and its launcher tear the tree down; attach stamps a log line
    # with the tick that read it, and when that tick falls within 0.2 s after the kill the exception reads
    # as the tear-down's reason (docs/fault-matrix.md, "Known wrong: a kill and its echo within a tick").
    "sglang-tp2-TP1-weights-spin-attach",
    "sglang-tp2-TP1-serving-block-run",
]
# hangwatch's --timeout for a cell: a weights-phase fault fires ~30 s into a vLLM boot, an SGLang boot
# takes 16-50 s; the verdict must come within the cell's bound (at most 35 s) after that.
CELL_TIMEOUT_S = 180.0
# A serving cell is stopped (Ctrl-C: hangwatch writes its report) this long after the fault is armed;
# its bound is 35 s. Without it, `run` supervises a serving server with no end.
SERVE_S = 90.0


@pytest.fixture(scope="module")
def tracker() -> Iterator[matrix.Tracker]:
    t = matrix.Tracker()
    try:
        yield t
    finally:
        t.close()


def _need(engine: str, request: pytest.FixtureRequest) -> None:
    if engine == "vllm":
        python = request.getfixturevalue("vllm_python")  # builds the venv once, or fails loudly
        request.getfixturevalue("tiny_model")
        if Path(python) != matrix.VLLM_PYTHON:
            matrix.VLLM_PYTHON = Path(python)
        return
    if os.environ.get("HANGWATCH_SKIP_SGLANG") == "1":
        pytest.skip("HANGWATCH_SKIP_SGLANG=1: SGLang end-to-end cells disabled by the environment")
    python = request.getfixturevalue("sglang_python")
    model = request.getfixturevalue("sglang_tiny_model")
    matrix.SGLANG_PYTHON, matrix.SGLANG_MODEL = Path(python), Path(model)
    why = matrix.engine_available("sglang")
    if why is not None:
        pytest.fail(
            f"SGLang CPU environment not usable: {why} (HANGWATCH_SKIP_SGLANG=1 skips)", pytrace=False
        )


SANITY_MARGIN_S = 20.0


@pytest.mark.timeout(int(CELL_TIMEOUT_S) + 240, func_only=True)
@pytest.mark.parametrize("name", SUBSET)
def test_fault_cell(
    name: str, request: pytest.FixtureRequest, tracker: matrix.Tracker, tmp_path: Path
) -> None:
    cell = matrix.cell_by_name(name)
    _need(cell.engine, request)
    cfg = matrix.RunConfig(workdir=tmp_path, boot_timeout_s=CELL_TIMEOUT_S, serve_after_ready_s=SERVE_S)
    result = matrix.run_cell(cell, cfg, tracker)
    print(matrix.format_table([result]))  # shown with -rA: the latency of a passing cell too
    exp = cell.expected()
    assert result.fired is not None, f"{name}: the fault never fired; log {result.log_path}"
    # The verdict must be right; its latency goal is a figure (benchmarks/fault_matrix.py prints it),
    # checked here only as a sanity bound: it came from hangwatch, not from the engine's own timeout.
    assert result.latency_s is not None and result.latency_s <= exp.bound_s + SANITY_MARGIN_S, (
        f"{name}: verdict {result.latency_s} s after the fault (goal {exp.bound_s:g} s)"
    )
    assert result.right, (
        f"{name}: expected {exp.state}/{'|'.join(exp.causes)}, culprit pid {result.fired['pid']} "
        f"({result.fired['title']}), within {exp.bound_s:g} s\n"
        f"got {result.got_state}/{result.got_cause}, culprits {result.got_culprits}, "
        f"latency {result.latency_s} s\nwrong: {'; '.join(result.why_wrong)}\n"
        f"summary: {result.summary}\nphase: {result.got_phase}\nprocesses: {result.processes}\n"
        f"report {result.report_path}, log {result.log_path}"
    )
