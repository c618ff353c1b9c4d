"""A Report built by hand, with the same text from the server in every field that can carry some
(imported by unit tests as ``reports``)."""

from __future__ import annotations

from hangwatch.analyse.stacktree import build_tree
from hangwatch.model.report import PhaseSpan
from hangwatch.model.report import ProcessRecord
from hangwatch.model.report import Report
from hangwatch.model.report import Verdict
from hangwatch.model.samples import LogFinding
from hangwatch.model.samples import LogSample
from hangwatch.model.samples import PhaseEvent
from hangwatch.model.samples import ProcessSample
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import ProcessStacks
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import ThreadStack
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import State


def process_sample(pid: int, name: str) -> ProcessSample:
    return ProcessSample(
        pid=pid, ppid=1, name=name, cmdline=(name,), state="S", cpu_s=1.0, cpu_delta_s=0.0, rchar=0,
        wchar=0, io_delta_bytes=0, threads=1, rss_bytes=0, listening_ports=(), role=None, rank=None,
    )  # fmt: skip


def report_with(text: str, state: State = State.CRASHED) -> Report:
    """Every free-text field of the report (summary, phase, evidence, notes, names, log lines,
    findings, phase lines, stack frames and source lines) carries ``text``."""
    frames = (Frame("main", "serve.py", 10), Frame("load", "serve.py", 20, code=f"raise X({text!r})"))
    stack = ProcessStacks(
        pid=101, name=f"worker {text}", role=None, rank=None, outcome=DumpOutcome.OK,
        threads=(ThreadStack(101, "MainThread", False, False, frames),),
    )  # fmt: skip
    sample = StackSample(t=2.0, processes=(stack,), elapsed_s=0.1)
    tick = Tick(
        t=2.0,
        processes=(process_sample(101, f"worker {text}"),),
        log=LogSample(
            new_bytes=10,
            new_lines=1,
            phase_events=(PhaseEvent(1.0, "load", f"loading {text}"),),
            findings=(LogFinding(2.0, Cause.EXCEPTION, f"RuntimeError: {text}"),),
            last_line=f"last {text}",
        ),
    )
    verdict = Verdict(
        state=state,
        cause=Cause.EXCEPTION,
        phase=f"load (loading {text})",
        summary=f"the command failed: RuntimeError: {text}",
        culprits=(101,),
        evidence=(f"log: RuntimeError: {text}", f"last line: {text}"),
        next_steps=("Read the traceback: `py-spy dump --pid PID`.",),
        confidence="high",
    )
    return Report(
        schema="hangwatch.report/1",
        engine="generic",
        mode="run",
        command=("python", "serve.py", text),
        started_at="2025-01-01T00:00:00+00:00",
        duration_s=3.0,
        log_path="/tmp/run/output.log",
        verdict=verdict,
        phases=(PhaseSpan("load", 1.0, None, label=f"loading {text}", line=f"loading {text}"),),
        processes=(
            ProcessRecord(
                101, 1, f"worker {text}", (f"worker {text}",), None, None, "S", None, None, 0.0, 2.0
            ),
        ),
        probes=(),
        timeline=(tick,),
        notes=(f"note: {text}",),
        stacks=(sample,),
        stack_tree=build_tree([sample]),
    )
