"""The kernel reader on real processes, with a stand-in debugger (tests/fakes/cuda_gdb_standin.py) that
acts on the real target as cuda-gdb does: the output of a real attach is read, a refusal is said, a target
left stopped by a debugger killed at its deadline is resumed, and a stopped target is never attached to.
What only the GPU machine shows (the real debugger, real kernels) is in docs/gpu-validation.md.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from hangwatch.collect.cudagdb import KernelReader
from hangwatch.model.gpukernels import KernelOutcome
from proc_helpers import proc_state
from proc_helpers import spawn
from proc_helpers import wait_until

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cuda_gdb"
STANDIN = Path(__file__).resolve().parents[1] / "fakes" / "cuda_gdb_standin.py"

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def debugger(tmp_path, monkeypatch):
    """An executable named cuda-gdb that runs the stand-in; its calls are logged."""
    path = tmp_path / "bin" / "cuda-gdb"
    path.parent.mkdir()
    path.write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN} "$@"\n')
    path.chmod(0o755)
    monkeypatch.setenv("HW_CUDA_GDB_LOG", str(tmp_path / "calls.jsonl"))
    return path


def _calls(tmp_path) -> list[list[str]]:
    log = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _sleeper():
    return spawn([sys.executable, "-c", "import time; time.sleep(120)"])


def test_a_real_attach_is_read_and_the_target_goes_on(debugger, tmp_path, monkeypatch):
    monkeypatch.setenv("HW_CUDA_GDB_OUTPUT", str(FIXTURES / "torch_spin.txt"))
    with _sleeper() as target:
        wait_until(lambda: proc_state(target.pid) == "S", 10, what="the target asleep")
        sample = KernelReader(debugger=str(debugger)).capture([target.pid], 12.0)
        [c] = sample.captures
        assert c.outcome is KernelOutcome.OK and not c.resumed
        [k] = c.kernels
        assert k.launch == "spin_kernel(long)<<<(1,1,1),(1,1,1)>>>" and k.sms == 1 and k.device == 0
        assert c.state_after == "S" and proc_state(target.pid) == "S"
        assert sample.t == 12.0 and sample.debugger == str(debugger)
    [call] = _calls(tmp_path)
    assert call[call.index("-p") + 1] == str(target.pid) and "--batch" in call and call[-1] == "detach"


def test_a_refusal_is_said_with_the_debuggers_reason(debugger, monkeypatch):
    monkeypatch.setenv("HW_CUDA_GDB_MODE", "refuse")
    with _sleeper() as target:
        [c] = KernelReader(debugger=str(debugger)).capture([target.pid], 0.0).captures
        assert c.outcome is KernelOutcome.REFUSED and "Operation not permitted" in c.detail
        assert c.kernels == () and proc_state(target.pid) in ("S", "R")


def test_a_target_left_stopped_by_a_killed_debugger_is_resumed(debugger, monkeypatch):
    monkeypatch.setenv("HW_CUDA_GDB_MODE", "stop-and-hang")
    with _sleeper() as target:
        wait_until(lambda: proc_state(target.pid) == "S", 10, what="the target asleep")
        [c] = KernelReader(debugger=str(debugger), deadline_s=2.0).capture([target.pid], 0.0).captures
        assert c.outcome is KernelOutcome.TIMEOUT and "did not finish in 2 s" in c.detail
        assert c.resumed is True
        assert proc_state(target.pid) in ("S", "R")  # running again, not T


def test_a_stopped_target_is_never_attached_to(debugger, tmp_path, monkeypatch):
    monkeypatch.setenv("HW_CUDA_GDB_OUTPUT", str(FIXTURES / "torch_spin.txt"))
    with _sleeper() as target:
        os.kill(target.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: proc_state(target.pid) == "T", 10, what="the target stopped")
            [c] = KernelReader(debugger=str(debugger)).capture([target.pid], 0.0).captures
            assert c.outcome is KernelOutcome.STOPPED and "evidence" in c.detail
            assert proc_state(target.pid) == "T"  # left as it was: its stop is not ours to undo
        finally:
            os.kill(target.pid, signal.SIGCONT)
    assert _calls(tmp_path) == []


def test_several_processes_are_read_at_once_and_a_gone_one_is_said(debugger, monkeypatch):
    monkeypatch.setenv("HW_CUDA_GDB_OUTPUT", str(FIXTURES / "cupy_spin.txt"))
    with _sleeper() as a, _sleeper() as b:
        gone = spawn([sys.executable, "-c", "pass"])
        with gone as g:
            g.wait()
        sample = KernelReader(debugger=str(debugger)).capture([a.pid, b.pid, g.pid], 0.0)
        outcomes = {c.pid: c.outcome for c in sample.captures}
        assert outcomes == {a.pid: KernelOutcome.OK, b.pid: KernelOutcome.OK, g.pid: KernelOutcome.GONE}
        assert all(c.kernels[0].launch == "wait_for_flag<<<(1,1,1),(1,1,1)>>>" for c in sample.captures[:2])
