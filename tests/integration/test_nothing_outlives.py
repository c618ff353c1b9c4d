"""Nothing of the launched tree outlives hangwatch, whatever the launcher does while it is shut down.

Real processes: ``tests/programs/unruly_launcher.py`` records every process it ever starts (pid and
start time) in a ledger; after hangwatch has ended (by itself, or SIGKILLed halfway through its own
clean-up as ``timeout -k`` does), no process of the ledger may remain. /proc is polled for a bounded
time: the guardian needs a moment after hangwatch's death.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hwrun import program
from proc_helpers import kill_tree
from proc_helpers import wait_for_file

pytestmark = pytest.mark.timeout(120)

GONE_WITHIN_S = 20.0


def _starttime(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    # A zombie has ended only once its last thread has (num_threads): state Z is the main thread's.
    return None if fields[0] == "Z" and int(fields[17]) <= 1 else int(fields[19])


def _ledger(path: Path) -> set[tuple[int, int]]:
    if not path.exists():
        return set()
    return {(int(p), int(s)) for p, s in (line.split() for line in path.read_text().splitlines() if line)}


def _alive(identities: set[tuple[int, int]]) -> set[tuple[int, int]]:
    return {(pid, start) for pid, start in identities if _starttime(pid) == start}


def _assert_none_left(ledger: Path, timeout: float = GONE_WITHIN_S) -> None:
    deadline = time.monotonic() + timeout
    while True:
        left = _alive(_ledger(ledger))
        if not left:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"processes of the tree outlived hangwatch: {sorted(left)}")
        time.sleep(0.1)


@contextlib.contextmanager
def _hangwatch(tmp_path: Path, *launcher_args: str, grace: float = 10.0):  # type: ignore[no-untyped-def]
    ready, ledger = tmp_path / "ready", tmp_path / "ledger"
    argv = [
        sys.executable, "-m", "hangwatch", "run", "--quiet", "--no-doctor", "--no-stacks",
        "--run-dir", str(tmp_path / "run"), "--grace", f"{grace:g}", "--stall-after", "60", "--",
        *program("unruly_launcher", "--ready-file", str(ready), "--ledger", str(ledger), *launcher_args),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_for_file(ready, timeout=60, popen=proc)
        time.sleep(1.5)  # a tick or two: hangwatch has seen the tree and told the guardian
        yield proc, ledger
    finally:
        # Whatever happened, kill what is left of the tree (by identity) and hangwatch's own.
        for pid, start in _alive(_ledger(ledger)):
            if _starttime(pid) == start:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        kill_tree(proc)


def _term_then_kill(proc: subprocess.Popen[bytes], after_s: float | None) -> None:
    proc.send_signal(signal.SIGTERM)
    if after_s is None:
        proc.communicate(timeout=60)
        return
    try:
        proc.communicate(timeout=after_s)
    except subprocess.TimeoutExpired:
        proc.kill()  # SIGKILL halfway through the clean-up: the guardian must finish it
        proc.communicate(timeout=10)


def test_sigkill_halfway_through_cleanup(tmp_path):
    """(a) The launcher ignores SIGTERM; its children, on SIGTERM, hand over to a new detached process
    and exit; hangwatch is SIGKILLed 1 s after its SIGTERM, as ``timeout -k`` does."""
    with _hangwatch(tmp_path, "--ignore-term", "30", "--handoff", "--detach") as (proc, ledger):
        _term_then_kill(proc, after_s=1.0)
        assert proc.returncode == -signal.SIGKILL
        _assert_none_left(ledger)


@pytest.mark.parametrize("kill_after", [None, 1.5], ids=["hangwatch-finishes", "hangwatch-sigkilled"])
def test_launcher_respawns_children_during_teardown(tmp_path, kill_after):
    """(b) During the tear-down the launcher keeps killing its children and starting new ones, each in a
    session of its own: a child started after the clean-up began is still found and killed."""
    with _hangwatch(tmp_path, "--ignore-term", "30", "--respawn", "--detach", grace=1.0) as (proc, ledger):
        _term_then_kill(proc, after_s=kill_after)
        if kill_after is None:
            assert proc.returncode == 130
        _assert_none_left(ledger)


@pytest.mark.parametrize("detach", [False, True], ids=["in-session", "detached"])
@pytest.mark.parametrize("kill_after", [None, 4.0], ids=["hangwatch-finishes", "timeout-k"])
def test_launcher_starts_crash_diagnostics_after_sleeping(tmp_path, detach, kill_after):
    """(c) On SIGTERM the launcher sleeps 5 s "before crash diagnostics", then starts a new process
    and exits (SGLang does). hangwatch is SIGKILLed 4 s in, before the launcher starts it: the guardian
    must stop the sleeping launcher. (SIGKILLed at the very moment the launcher forks a detached child
    and exits, the child can be orphaned to init before the guardian's first scan sees it: the known gap.)"""
    args = ["--diagnostics-after", "5", *(["--detach"] if detach else [])]
    with _hangwatch(tmp_path, *args) as (proc, ledger):
        _term_then_kill(proc, after_s=kill_after)
        _assert_none_left(ledger)


@pytest.mark.parametrize("kill_after", [None, 0.5], ids=["hangwatch-finishes", "hangwatch-sigkilled"])
def test_a_child_whose_main_thread_ended_is_still_stopped(tmp_path, kill_after):
    """(d) Each child ends its main thread alone while another thread of it runs on, ignoring SIGTERM:
    /proc shows a zombie, yet it runs and cannot be reaped. Taken for ended, it was never signalled and
    outlived hangwatch; it must get SIGKILL after the grace like any member that ignores SIGTERM, from
    hangwatch or, when hangwatch is SIGKILLed within the grace, from its guardian."""
    with _hangwatch(tmp_path, "--main-thread-exits", grace=1.0) as (proc, ledger):
        _term_then_kill(proc, after_s=kill_after)
        _assert_none_left(ledger)
