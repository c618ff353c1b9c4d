"""Our native unwinder (collect/unwind.py) on real processes: the same stacks as ``py-spy dump --native``
thread by thread, nothing left stopped or traced, and a grabber killed mid-way harms nothing.

The program (tests/programs/native_waits.py) parks one thread in each common wait: a sleep, a lock, an
event, a pipe read, a queue, a child's exit, a 300-deep recursion, a C call through ctypes, and a gloo
``all_reduce`` whose peer never joins (frames inside libtorch). py-spy is the reference: it reads the
same process with its own unwinder and symbol loader. Where a library carries debug information (here,
CPython's own extension modules, built with ``-g``), py-spy also names functions the compiler inlined,
and names the source file instead of the library: those frames are the only difference allowed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from builders import process_sample
from hangwatch.collect import procfs
from hangwatch.collect.stacks import StackDumper
from hangwatch.collect.unwind import GRAB_SCRIPT
from hangwatch.collect.unwind import NativeUnwinder
from hangwatch.collect.unwind import UnwindError
from hangwatch.model.stacks import DumpOutcome
from proc_helpers import free_port
from proc_helpers import spawn
from proc_helpers import wait_for_file
from proc_helpers import wait_until
from stack_compare import comparable

PROGRAM = Path(__file__).resolve().parents[1] / "programs" / "native_waits.py"
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(NativeUnwinder().unavailable is not None, reason="our unwinder does not run here"),
]


@pytest.fixture(scope="module")
def waiting(tmp_path_factory):
    """The program with every thread in its wait (and a gloo pair when torch is importable)."""
    tmp = tmp_path_factory.mktemp("native-waits")
    argv = [sys.executable, str(PROGRAM), "--ready", str(tmp / "ready"), "--heartbeat", str(tmp / "beat")]
    try:
        import torch  # noqa: F401

        argv += ["--torch-port", str(free_port())]
    except ImportError:
        pass
    with spawn(argv) as proc:
        wait_for_file(tmp / "ready", 60)
        yield proc.pid, tmp / "beat"


def _status(pid: int, tid: int) -> dict[str, str]:
    """A thread's /proc status fields ({} once it ended)."""
    try:
        status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    except OSError:
        return {}
    return {k: v.strip() for k, v in (line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)}


def _running(pid: int) -> None:
    """Every thread runs on: none stopped, none traced."""
    for tid in procfs.thread_ids(pid):
        fields = _status(pid, tid)
        assert fields.get("TracerPid", "0") == "0", f"thread {tid} is still traced"
        assert not fields.get("State", "").startswith(("t", "T")), f"thread {tid} is {fields['State']}"


def _beats(path: Path) -> int:
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text.isdigit() else 0


def test_our_native_frames_are_py_spys_thread_by_thread(waiting):
    pid, _ = waiting
    sample = process_sample(pid, "native_waits")
    ours = StackDumper().dump(sample, native=True)
    theirs = StackDumper(unwinder=None).dump(sample, native=True)
    assert ours.outcome is DumpOutcome.OK and theirs.outcome is DumpOutcome.OK, (ours.detail, theirs.detail)
    reference = {t.tid: t for t in theirs.threads}
    assert ours.native and {t.tid for t in ours.threads} == set(reference)
    by_name = {t.name: t for t in ours.threads}
    # The main thread beats ten times a second: it may move between py-spy's reading and ours (it then
    # keeps its Python frames, and the dump says so). Every waiting thread must merge, and match.
    assert ours.detail is None or ours.detail.startswith("1 of"), ours.detail
    for t in ours.threads:
        if t.name == "MainThread":
            continue
        a, b = comparable(t.frames, reference[t.tid].frames)
        assert a == b, f"thread {t.name} ({t.tid})"
    # What the rules read is there: the interpreter's own waits, libc's, and torch's inside a collective.
    leaf = {name: [f.name for f in t.frames if f.native] for name, t in by_name.items()}
    assert "time_sleep" in leaf["sleeper"] and "lock_PyThread_acquire_lock" in leaf["locker"]
    assert "pause" in leaf["native"] and "os_read" in leaf["piper"]
    assert sum(f.name == "deep" for f in by_name["deep"].frames) == 301
    if "gloo" in by_name:
        assert "c10d::Work::wait" in leaf["gloo"]
    _running(pid)


def test_a_second_process_and_round_reuse_what_the_first_read(waiting):
    pid, _ = waiting
    unwinder = NativeUnwinder()
    tids = procfs.thread_ids(pid)
    first = unwinder.unwind(pid, tids)
    files = len(unwinder._files)
    again = unwinder.unwind(pid, tids)
    assert len(unwinder._files) == files  # no library opened twice
    assert again.threads.keys() == first.threads.keys() and not again.missing
    assert {t: [f.name for f in fs] for t, fs in again.threads.items()} == {
        t: [f.name for f in fs] for t, fs in first.threads.items()
    }
    _running(pid)


def test_a_grabber_killed_at_any_moment_leaves_the_process_running(waiting):
    """Killed before, during and after it holds the threads: the kernel lets them go with their tracer,
    and PTRACE_SEIZE left no SIGSTOP pending. The process's heartbeat goes on."""
    pid, beat = waiting
    tids = procfs.thread_ids(pid)
    for deadline in (0.005, 0.02, 0.04, 0.06, 0.08, 0.12):
        unwinder = NativeUnwinder(deadline_s=deadline)
        try:
            unwinder.unwind(pid, tids)
        except UnwindError as exc:
            assert "did not answer" in str(exc) or "exited" in str(exc)
        wait_until(
            lambda: all(_status(pid, t).get("TracerPid", "0") == "0" for t in procfs.thread_ids(pid)),
            5,
            what="no tracer",
        )
        _running(pid)
    before = _beats(beat)
    wait_until(lambda: _beats(beat) > before + 2, 5, what="the heartbeat going on")


def test_a_thread_that_ended_is_said_and_the_rest_are_read(waiting):
    pid, _ = waiting
    # A thread id no process has: the grabber touches only the threads of the process it is given. Taken
    # below the last id the kernel gave out, which it hands out upwards from: the first free id above the
    # process's threads was often the very next one, and a process that another test started meanwhile
    # took it (a fresh clone's `make test`, 2026-12-06).
    last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    gone = next(t for t in range(last - 1, 1, -1) if not Path(f"/proc/{t}").exists())
    stacks = NativeUnwinder().unwind(pid, [pid, gone])
    assert pid in stacks.threads and stacks.missing == {gone: "the thread ended"}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to run the grabber as a user who may not trace")
def test_a_process_it_may_not_read_is_an_error_not_a_crash(tmp_path):
    with spawn([sys.executable, "-c", "import time; time.sleep(60)"]) as proc:
        wait_until(lambda: procfs.read_stat(proc.pid) is not None, 5, what="the child")

        # The real grabber, as a user who may not trace root's processes (nobody).
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        # A checkout nobody may read (a clone under a 0700 `mktemp -d`) cannot run the grabber at all,
        # as test_stacks_cli's unprivileged case finds for the interpreter: nothing to learn here then.
        readable = subprocess.run(
            [*prefix, sys.executable, "-c", f"open({str(GRAB_SCRIPT)!r}).close()"],
            capture_output=True,
            check=False,
        )
        if readable.returncode != 0:
            pytest.skip(f"uid 65534 cannot read {GRAB_SCRIPT}: {readable.stderr.decode()[-200:]}")
        nobody = NativeUnwinder(prefix=prefix)
        with pytest.raises(UnwindError, match="not permitted"):
            nobody.unwind(proc.pid, [proc.pid])
        _running(proc.pid)


def test_a_thread_caught_in_the_vdso_unwinds_through_it():
    """A thread polling the clock (a CUDA synchronize spinning does) is often inside the vDSO, which is in
    memory only: its frames come from the kernel's image, and the unwinding goes on to the process's
    start. The GPU check found one in three captures of a spinning cudaDeviceSynchronize stopped there."""
    with spawn([sys.executable, "-c", "import time\nwhile True:\n    time.monotonic()"]) as proc:
        wait_until(lambda: procfs.read_stat(proc.pid) is not None, 5, what="the child")
        unwinder = NativeUnwinder()
        for _ in range(300):  # about one capture in three lands in the vDSO
            frames = unwinder.unwind(proc.pid, [proc.pid]).threads[proc.pid]
            if frames and frames[0].module == "[vdso]":
                break
        else:
            pytest.fail("no capture of a thread polling the clock was inside the vDSO")
        names = [f.name for f in frames]
        assert names[0] == "clock_gettime", names
        assert "time_monotonic" in names and "_PyEval_EvalFrameDefault" in names, names
        assert names[-1] == "_start", names  # through the vDSO and every caller to the process's start
        _running(proc.pid)
