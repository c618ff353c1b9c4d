"""The fault injector's kinds do what the matrix's expectations assume, on real processes.

A program imports a module of its own and calls its function; tests/faults/sitecustomize.py on
PYTHONPATH wraps the function and fires the fault on its first call. What each kind must leave behind is
read from /proc, as hangwatch would read it: a death by signal, or a live process parked where the kind
says (a bare kernel read, a lock, a loop of timed sleeps).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

FAULTS = Path(__file__).resolve().parents[1] / "faults"
# /proc/PID/syscall's first field: the blocked call's number (x86-64 and arm64)
READ = {"x86_64": 0, "aarch64": 63}
FUTEX = {"x86_64": 202, "aarch64": 98}
# nanosleep, clock_nanosleep, and select / pselect6 (time.sleep before Python 3.11)
TIMED_SLEEPS = {"x86_64": {35, 230, 23}, "aarch64": {101, 115, 72}}


def _start(tmp_path: Path, kind: str) -> subprocess.Popen[bytes]:
    (tmp_path / "target_mod.py").write_text("def work():\n    return 1\n")
    ready = tmp_path / "called"
    program = f"import target_mod, pathlib; pathlib.Path({str(ready)!r}).touch(); target_mod.work()"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(FAULTS), str(tmp_path)])
    env["HANGWATCH_FAULT"] = f"kind={kind};target=target_mod:work;who=any"
    return subprocess.Popen(
        [sys.executable, "-c", program], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def _settled_syscall(pid: int) -> int:
    """The main thread's blocked system call once it is in the fault (the first line of stderr)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = Path(f"/proc/{pid}/syscall").read_text().split()
        if text and text[0] != "running":
            return int(text[0])
        time.sleep(0.05)
    raise AssertionError("never blocked")


def _machine() -> str:
    machine = os.uname().machine
    if machine not in READ:
        pytest.skip(f"system call numbers not listed for {machine}")
    return machine


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


@pytest.mark.parametrize(
    ("kind", "calls"),
    [("pause", READ), ("lock", FUTEX)],
)
def test_a_blocking_kind_parks_the_thread_in_the_kernel_with_no_timeout(
    tmp_path: Path, kind: str, calls: dict[str, int]
) -> None:
    machine = _machine()
    proc = _start(tmp_path, kind)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline().decode()
        assert f"fired kind={kind}" in line, line
        assert _settled_syscall(proc.pid) == calls[machine]
        time.sleep(0.5)
        assert proc.poll() is None  # still there: nothing ends the wait
    finally:
        _stop(proc)


def test_sleep_is_a_loop_of_timed_waits(tmp_path: Path) -> None:
    machine = _machine()
    proc = _start(tmp_path, "sleep")
    try:
        assert proc.stderr is not None
        assert "fired kind=sleep" in proc.stderr.readline().decode()
        seen = set()
        for _ in range(5):
            seen.add(_settled_syscall(proc.pid))
            time.sleep(0.07)
        assert seen <= TIMED_SLEEPS[machine], seen
        assert proc.poll() is None
    finally:
        _stop(proc)


def test_segv_dies_by_the_signal(tmp_path: Path) -> None:
    proc = _start(tmp_path, "segv")
    try:
        assert proc.wait(30) == -signal.SIGSEGV
    finally:
        _stop(proc)


def test_exit0_leaves_cleanly_without_a_word(tmp_path: Path) -> None:
    proc = _start(tmp_path, "exit0")
    try:
        assert proc.wait(30) == 0
        assert proc.stderr is not None
        said = proc.stderr.read().decode()
        assert "fired kind=exit0" in said and "Traceback" not in said, said
    finally:
        _stop(proc)


def test_retrylog_logs_the_same_words_with_new_counts_and_lives_on(tmp_path: Path) -> None:
    proc = _start(tmp_path, "retrylog")
    try:
        assert proc.stderr is not None
        assert "fired kind=retrylog" in proc.stderr.readline().decode()
        first, second = proc.stderr.readline().decode(), proc.stderr.readline().decode()
        assert "still waiting" in first and "(attempt 1, waited 2 s)" in first, first
        assert "(attempt 2, waited 4 s)" in second, second
        assert proc.poll() is None
    finally:
        _stop(proc)
