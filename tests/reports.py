"""A Report built by hand, with the same text from the server in every field that can carry some
(imported by unit tests as ``reports``)."""

from __future__ import annotations

import dataclasses

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


def timeline_report() -> Report:
    """A stalled four-rank run, fixed: pids not in rank order, TP2's CPU flat from 12 s, two GPUs, five
    phases (one too narrow for its label), the last progress at 20 s and the verdict at 32 s; the
    ranks were sleeping at the verdict and ended on the clean-up's SIGTERM."""
    from hangwatch.model.samples import GpuReading
    from hangwatch.model.samples import GpuSample

    ranks = {104: "TP3", 101: "TP1", 103: "TP0", 102: "TP2"}  # pid -> rank, not in rank order
    ticks = []
    for t in range(0, 33, 2):
        procs = [
            dataclasses.replace(
                process_sample(100, "launcher"), cpu_delta_s=0.1 if 0 < t < 20 else 0.0, io_delta_bytes=0
            )
        ]
        for pid, rank in ranks.items():
            busy = 0 < t < 20 and not (rank == "TP2" and t >= 12)  # no delta at first sight
            procs.append(
                dataclasses.replace(
                    process_sample(pid, f"sglang::scheduler_{rank}"),
                    ppid=100,
                    rank=rank,
                    role="scheduler",
                    cpu_delta_s=1.8 if busy else 0.0,  # the same for every busy rank: the lines overlap
                    io_delta_bytes=(2 << 20) if busy and t < 10 else 0,
                )
            )
        gpus = tuple(
            GpuReading(i, "NVIDIA H200", 90.0 if t < 20 else 0.0, 40.0 if t < 20 else 0.0, 60 << 30, 141 << 30,
                       500.0 if t < 20 else 120.0, 1980)
            for i in (0, 1)
        )  # fmt: skip
        ticks.append(
            Tick(
                t=float(t),
                processes=tuple(procs),
                log=LogSample(new_bytes=100, new_lines=5 if t < 20 else 0),
                gpu=GpuSample(gpus=gpus),
            )
        )
    phases = (
        PhaseSpan("launch", 0.0, 4.0, label="starting"),
        PhaseSpan("load_weights", 4.0, 10.0, label="loading weights"),
        PhaseSpan("kv_cache", 10.0, 10.6, label="allocating the KV cache"),
        PhaseSpan("cuda_graph", 10.6, None, label="capturing CUDA graphs"),
    )
    verdict = Verdict(
        state=State.STALLED,
        cause=Cause.COLLECTIVE_WAIT,
        phase="cuda_graph (capturing CUDA graphs)",
        summary="stalled: nothing progressed for 12 s",
        culprits=(102,),
        evidence=("log silent 12 s",),
    )
    processes = tuple(
        ProcessRecord(
            pid, 100 if pid != 100 else 1, name, (name,), "scheduler" if rank else None, rank or None,
            "gone", -15, "waitpid", 0.0, 33.0, verdict_state="S", cleanup="SIGTERM: -15",
        )
        for pid, name, rank in [(100, "launcher", "")]
        + [(pid, f"sglang::scheduler_{rank}", rank) for pid, rank in ranks.items()]
    )  # fmt: skip
    return Report(
        schema="hangwatch.report/1",
        engine="sglang",
        mode="run",
        command=("python", "-m", "sglang.launch_server"),
        started_at="2025-01-01T00:00:00+00:00",
        duration_s=32.0,
        log_path="/tmp/run/output.log",
        verdict=verdict,
        phases=phases,
        processes=processes,
        probes=(),
        timeline=tuple(ticks),
        last_progress_t=20.0,
        stall_after_s=10.0,
    )
