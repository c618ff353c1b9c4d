"""The py-spy boundary: parsing real ``py-spy dump --json`` output, error text, and the never-stopped rules.

The dumper's process runner and /proc root are injected: a fake /proc holds stat lines whose state the
fake runner changes, so each rule (skip a stopped target, resume one a dump left stopped, fall back
from --native, translate failures) runs exactly the production code without any ptrace.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from fixtures.stacks import loader
from hangwatch.collect.stacks import DumpRun
from hangwatch.collect.stacks import StackDumper
from hangwatch.collect.stacks import classify_failure
from hangwatch.collect.stacks import parse_dump
from hangwatch.collect.stacks import short_native_name
from hangwatch.errors import PTRACE_HELP
from hangwatch.model.samples import ProcessSample
from hangwatch.model.stacks import DumpOutcome

# Real py-spy 0.4.3 stderr, captured on this machine (RUST_BACKTRACE=0).
DENIED = (
    "Permission Denied: Try running again with elevated permissions by going 'sudo env \"PATH=$PATH\" !!'"
)
DENIED_PID1 = (
    "Error: Failed to get process executable name. Check that the process is running.\n\nCaused by:\n"
    "    0: Permission denied (os error 13)\n    1: Permission denied (os error 13)"
)
NOT_PYTHON = "Error: Failed to find python version from target process"
GONE = (
    "Error: Failed to get process executable name. Check that the process is running.\n\nCaused by:\n"
    "    0: No such file or directory (os error 2)\n    1: No such file or directory (os error 2)"
)


def _raw(name: str, pid_index: int, mode: str = "native") -> str:
    process = loader.load(name)["samples"][0]["processes"][pid_index]
    return json.dumps(process["dumps"][mode]["json"])


def test_parse_real_native_dump_outermost_first_with_native_leaf():
    threads = parse_dump(_raw("missing_collective", 2))
    main = next(t for t in threads if t.name == "MainThread")
    names = [f.name for f in main.frames]
    assert names.index("<module>") < names.index("all_reduce") < names.index("c10d::Work::wait")
    wait = next(f for f in main.frames if f.name == "c10d::Work::wait")
    assert wait.native and wait.file == "libtorch_cpu.so" and wait.line == 0
    # pybind11's template soup is shortened; unsymbolised addresses (ASLR) collapse to one ?? per library.
    assert "pybind11::cpp_function::initialize::{lambda#1}::_FUN" in names
    assert not any(n.startswith("0x") for n in names)
    assert main.tid > 0
    assert not main.active and not main.owns_gil


def test_parse_python_only_dump_and_thread_names():
    threads = parse_dump(_raw("lock_deadlock", 0, "python"))
    assert {t.name for t in threads} == {"MainThread", "worker-A", "worker-B"}
    worker = next(t for t in threads if t.name == "worker-A")
    assert [f.name for f in worker.frames][-1] == "take_a_then_b"
    assert not any(f.native for f in worker.frames)


def test_source_line_is_attached_to_the_innermost_python_frame():
    threads = parse_dump(_raw("lock_deadlock", 0), loader.source_line)
    worker = next(t for t in threads if t.name == "worker-B")
    python = [f for f in worker.frames if not f.native]
    assert python[-1].code == "with lock_a:  # never acquired"
    assert all(f.code is None for f in python[:-1])


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        parse_dump("Error: not json")
    with pytest.raises(ValueError):
        parse_dump('{"a": 1}')


def test_short_native_name():
    assert (
        short_native_name("f<int, std::vector<long> >(int, char)::{lambda(x)#1}::_FUN")
        == "f::{lambda#1}::_FUN"
    )
    assert short_native_name("c10d::Work::wait") == "c10d::Work::wait"


@pytest.mark.parametrize(
    ("stderr", "outcome"),
    [
        (DENIED, DumpOutcome.DENIED),
        (DENIED_PID1, DumpOutcome.DENIED),
        (NOT_PYTHON, DumpOutcome.NOT_PYTHON),
        (GONE, DumpOutcome.GONE),
        ("Error: something new", DumpOutcome.FAILED),
    ],
)
def test_failures_become_outcomes(stderr, outcome):
    got, detail = classify_failure(stderr)
    assert got is outcome
    if outcome is DumpOutcome.DENIED:
        assert PTRACE_HELP in detail and "SYS_PTRACE" in detail


class FakeProc:
    """A /proc with one stat file per pid whose state letter the test (or the fake runner) sets."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def set(self, pid: int, state: str) -> None:
        fields = ["0"] * 50
        fields[0] = state
        fields[1] = fields[2] = fields[3] = "1"
        fields[11], fields[12] = "100", "20"
        fields[19] = "5555"
        (self.root / str(pid)).mkdir(exist_ok=True)
        (self.root / str(pid) / "stat").write_text(f"{pid} (python) " + " ".join(fields))


def _sample(pid: int) -> ProcessSample:
    return ProcessSample(pid, 1, "gloo_rank1", (), "S", 1.2, 0.0, 0, 0, 0, 3, 0, (), None, None)


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path)


def test_stopped_target_is_skipped_not_dumped(proc):
    proc.set(7, "T")
    calls: list[list[str]] = []
    dumper = StackDumper(
        "py-spy", runner=lambda argv, d: calls.append(argv) or DumpRun(0, "[]", "", 0.0), root=proc.root
    )
    got = dumper.dump(_sample(7), native=True)
    assert got.outcome is DumpOutcome.STOPPED and got.state == "T"
    assert "evidence" in (got.detail or "")
    assert calls == []


def test_a_dump_that_leaves_the_target_stopped_is_undone(proc):
    proc.set(7, "S")
    resumed: list[int] = []

    def runner(argv: list[str], deadline: float) -> DumpRun:
        proc.set(7, "T")  # py-spy killed mid-dump: the target stays in group-stop
        return DumpRun(None, "", "", deadline)

    dumper = StackDumper("py-spy", runner=runner, root=proc.root, resume=resumed.append)
    got = dumper.dump(_sample(7), native=False)
    assert got.outcome is DumpOutcome.TIMEOUT
    assert got.resumed and resumed == [7]


def test_native_failure_falls_back_to_python_only_and_remembers(proc):
    proc.set(7, "S")
    raw = _raw("missing_collective", 2, "python")
    calls: list[list[str]] = []

    def runner(argv: list[str], deadline: float) -> DumpRun:
        calls.append(argv)
        if "--native" in argv:
            return DumpRun(1, "", "Error: Failed to unwind native stack", 0.2)
        return DumpRun(0, raw, "", 0.02)

    dumper = StackDumper("py-spy", runner=runner, root=proc.root)
    got = dumper.dump(_sample(7), native=True)
    assert got.outcome is DumpOutcome.OK and not got.native
    assert "Python frames only" in (got.detail or "")
    assert [("--native" in a) for a in calls] == [True, False]
    dumper.dump(_sample(7), native=True)
    assert "--native" not in calls[-1]  # not tried again for the same process


def test_permission_failure_carries_the_fix(proc):
    proc.set(7, "S")
    dumper = StackDumper("py-spy", runner=lambda a, d: DumpRun(1, "", DENIED, 0.01), root=proc.root)
    got = dumper.dump(_sample(7), native=False)
    assert got.outcome is DumpOutcome.DENIED and "ptrace_scope" in (got.detail or "")


def test_gone_and_zombie_targets(proc):
    dumper = StackDumper("py-spy", runner=lambda a, d: DumpRun(0, "[]", "", 0.0), root=proc.root)
    assert dumper.dump(_sample(8), native=False).outcome is DumpOutcome.GONE
    proc.set(9, "Z")
    assert dumper.dump(_sample(9), native=False).outcome is DumpOutcome.GONE


def test_no_py_spy_is_said_once_per_process(proc, monkeypatch):
    proc.set(7, "S")
    monkeypatch.setattr("hangwatch.collect.stacks.find_py_spy", lambda: None)
    dumper = StackDumper(root=proc.root)
    assert dumper.unavailable is not None and "pip install py-spy" in dumper.unavailable
    assert dumper.dump(_sample(7), native=True).outcome is DumpOutcome.NO_DUMPER


def test_capture_runs_every_dump_at_once(proc):
    for pid in (1, 2, 3, 4):
        proc.set(pid, "S")
    # Every dump waits for the other three: run one after the other, the barrier breaks. (Not a bound on
    # elapsed time or on overlapping sleeps: threads start late on a loaded machine.)
    barrier = threading.Barrier(4, timeout=30)
    met: list[int] = []

    def runner(argv: list[str], deadline: float) -> DumpRun:
        met.append(barrier.wait())
        return DumpRun(0, "[]", "", 0.3)

    dumper = StackDumper("py-spy", runner=runner, root=proc.root)
    sample = dumper.capture([_sample(p) for p in (1, 2, 3, 4)], t=5.0, native=False)
    assert sorted(met) == [0, 1, 2, 3]
    assert [p.pid for p in sample.processes] == [1, 2, 3, 4]
