"""What isolate checks between two trials (isolate/runner.py ``pids_alive``), on real processes.

A process has ended when its last thread has, not when /proc shows state Z: that is the main thread's
state, and the main thread ends first when it exits alone or its peers are slower to die (after SIGKILL
the last thread unmaps the address space). And a zombie that is ours (isolate adopts the trial's orphans)
is reaped there: left, it lay in the process table beside the next trial until isolate exited (the vLLM
isolate test, 2026-12-04).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from builders import process_record
from builders import report
from hangwatch.collect import procfs
from hangwatch.isolate.runner import pids_alive
from hangwatch.model.samples import ProcState
from proc_helpers import MAIN_THREAD_EXITS


def _spawn(code: str) -> int:
    """A child of ours, started without subprocess (whose bookkeeping would reap it behind our back)."""
    return os.posix_spawn(sys.executable, [sys.executable, "-c", code], dict(os.environ))


def _await_zombie(pid: int, timeout: float = 20.0) -> procfs.Stat:
    deadline = time.monotonic() + timeout
    while True:
        stat = procfs.read_stat(pid)
        assert stat is not None, f"{pid} vanished: someone else reaped it"
        if stat.state == ProcState.ZOMBIE:
            return stat
        assert time.monotonic() < deadline, f"{pid} never became a zombie: {stat}"
        time.sleep(0.02)


def _end(pid: int) -> None:
    """Whatever the test got to: killed (while it is still there) and reaped."""
    if procfs.read_stat(pid) is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def test_an_ended_child_of_ours_is_reaped_not_left_beside_the_next_trial() -> None:
    pid = _spawn("pass")
    try:
        assert _await_zombie(pid).exited
        assert pids_alive(report(processes=(process_record(pid, "python"),))) == []
        assert not Path(f"/proc/{pid}").exists(), "the zombie was left in the process table"
    finally:
        _end(pid)


def test_a_process_whose_main_thread_ended_is_still_there_until_its_last_thread_has() -> None:
    pid = _spawn(MAIN_THREAD_EXITS.format(ignore_term=False, sleep=60))
    try:
        stat = _await_zombie(pid)
        assert stat.num_threads == 2 and not stat.exited
        one = report(processes=(process_record(pid, "python"),))
        assert pids_alive(one) == [pid]
        assert Path(f"/proc/{pid}").exists(), "it cannot be reaped while a thread of it runs"
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 20.0
        while pids_alive(one) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pids_alive(one) == []
        assert not Path(f"/proc/{pid}").exists(), "ended at last, and reaped"
    finally:
        _end(pid)
