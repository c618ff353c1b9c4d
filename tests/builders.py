"""Model objects built by hand for unit tests (imported as ``builders``): small builders with defaults
for every field, overridden by keyword (``process_sample(7, "x", state="T")``), and whole reports:
``report_with`` (the same server text in every field that can carry some), ``timeline_report`` (a
stalled four-rank run), ``stalled_report`` (a deadlock with a merged stack tree)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from hangwatch.analyse.stacktree import build_tree
from hangwatch.model.kernelwaits import ProcessWaits
from hangwatch.model.kernelwaits import ThreadWait
from hangwatch.model.kernelwaits import Waker
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
from hangwatch.model.stacks import StackNode
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import StackTree
from hangwatch.model.stacks import ThreadStack
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import State
from hangwatch.render.live import LiveState


def process_sample(pid: int, name: str, **changes: Any) -> ProcessSample:
    sample = ProcessSample(
        pid=pid, ppid=1, name=name, cmdline=(name,), state="S", cpu_s=1.0, cpu_delta_s=0.0, rchar=0,
        wchar=0, io_delta_bytes=0, threads=1, rss_bytes=0, listening_ports=(), role=None, rank=None,
    )  # fmt: skip
    return dataclasses.replace(sample, **changes)


def process_record(pid: int, name: str, **changes: Any) -> ProcessRecord:
    """A process of the report, seen from 0 s to 10 s, still alive (state S)."""
    record = ProcessRecord(pid, 1, name, (name,), None, None, "S", None, None, 0.0, 10.0)
    return dataclasses.replace(record, **changes)


def verdict(state: State = State.STALLED, **changes: Any) -> Verdict:
    base = Verdict(state, None, None, f"{state.value}: a verdict built by hand", culprits=(), evidence=())
    return dataclasses.replace(base, **changes)


def report(v: Verdict | None = None, **changes: Any) -> Report:
    """A run report with nothing in it but the verdict: no processes, phases, samples or notes."""
    base = Report(
        schema="hangwatch.report/1", engine="generic", mode="run", command=("python", "serve.py"),
        started_at="2025-01-01T00:00:00+00:00", duration_s=10.0, log_path=None,
        verdict=v if v is not None else verdict(), phases=(), processes=(), probes=(), timeline=(),
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


def frames(*names: str, file: str = "serve.py") -> tuple[Frame, ...]:
    """Python frames, outermost first, on lines 10, 20, 30, ... of ``file``; a name with ``::`` or ending
    in ``()`` is a native frame (``c10d::Work::wait``, ``pthread_cond_wait()``)."""
    out = []
    for i, name in enumerate(names, 1):
        if "::" in name or name.endswith("()"):
            out.append(Frame(name.removesuffix("()"), "libtorch.so", native=True))
        else:
            out.append(Frame(name, file, 10 * i))
    return tuple(out)


def process_stacks(pid: int, name: str, stack: tuple[Frame, ...], **changes: Any) -> ProcessStacks:
    """One process dumped (outcome OK) with one main thread in ``stack``."""
    stacks = ProcessStacks(
        pid=pid, name=name, role=None, rank=None, outcome=DumpOutcome.OK,
        threads=(ThreadStack(pid, "MainThread", False, False, stack),),
    )  # fmt: skip
    return dataclasses.replace(stacks, **changes)


def stack_sample(t: float, *processes: ProcessStacks) -> StackSample:
    return StackSample(t=t, processes=processes, elapsed_s=0.05)


def report_stack_samples(path: Path) -> list[StackSample]:
    """The stack rounds of a real run, kept in a report's JSON shape (``{"stacks": [...]}``), as samples."""

    def process(raw: dict[str, Any]) -> ProcessStacks:
        threads = tuple(
            ThreadStack(
                t["tid"], t["name"], t["active"], t["owns_gil"], tuple(Frame(**f) for f in t["frames"])
            )
            for t in raw["threads"]
        )
        fields = {k: v for k, v in raw.items() if k not in ("threads", "outcome", "kernel")}
        return ProcessStacks(
            **fields, outcome=DumpOutcome(raw["outcome"]), threads=threads, kernel=kernel(raw.get("kernel"))
        )

    def kernel(raw: dict[str, Any] | None) -> ProcessWaits | None:
        if raw is None:
            return None
        threads = tuple(
            ThreadWait(t["tid"], t["call"], Waker(t["waker"]), tuple(t["on"]), t["child"], t.get("wakeups"))
            for t in raw["threads"]
        )
        return ProcessWaits(
            raw["pid"], threads, tuple(raw["writes"]), tuple(raw["sockets"]), tuple(raw.get("files", ()))
        )

    def pairs(raw: list[list[Any]] | None) -> tuple[Any, ...]:
        return tuple(tuple(x) for x in raw or ())

    return [
        StackSample(
            s["t"],
            tuple(process(p) for p in s["processes"]),
            s["elapsed_s"],
            unix_peers=pairs(s.get("unix_peers")),
            tcp_peers=pairs(s.get("tcp_peers")),
            lock_holders=pairs(s.get("lock_holders")),
            lock_owners=pairs(s.get("lock_owners")),
        )
        for s in json.loads(path.read_text())["stacks"]
    ]


def chain(
    label: str,
    pids: tuple[int, ...],
    *names: str,
    children: tuple[StackNode, ...] = (),
    unchanged: bool = True,
    minority: bool = False,
    text: str = "",
) -> StackNode:
    """A chain of merged-tree nodes, one per frame of ``frames(*names)``, every one passed by ``pids`` (one
    thread each); the last holds ``children``, or, with none, is where the threads end."""
    node = None
    for f in reversed(frames(*names)):
        last = node is None
        node = StackNode(
            name=f.name + (text if last else ""), file=f.file, native=f.native, lines=(f.line,) if f.line else (),
            threads=len(pids), pids=pids, label=label,
            children=children if last else (node,),
            ends=len(pids) if last and not children else 0,
            unchanged=len(pids) if last and not children and unchanged else 0, minority=minority,
        )  # fmt: skip
    assert node is not None
    return node


def stack_tree(
    *roots: StackNode, summary: str, samples: int = 2, problems: tuple[str, ...] = ()
) -> StackTree:
    pids = {pid for root in roots for pid in root.pids}
    return StackTree(roots, (), samples, len(pids), len(pids), summary, problems)


def live_state(**changes: Any) -> LiveState:
    """The live view's state at 12 s: one process, a refused probe, 48 s before a stall verdict."""
    from hangwatch.model.samples import ProbeOutcome
    from hangwatch.model.samples import ProbeResult

    base = LiveState(
        t=12.0, phase="weights", phase_label="loading weights", in_phase_s=5.0,
        processes=(process_sample(42, "python serve.py", cpu_delta_s=0.5, rss_bytes=3 << 30),),
        interval_s=1.0,
        probe=ProbeResult(t=12.0, url="http://127.0.0.1:8000/health", outcome=ProbeOutcome.REFUSED),
        time_to_stall_s=48.0, gpu=None, gpu_mem_by_pid={}, last_progress="2 s ago (I/O)",
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


def stalled_report(text: str = "") -> Report:
    """Four "scheduler" ranks of a launcher: TP0-2 wait in one barrier, TP3 in another, two samples apart
    with nothing moved; ``text`` is appended to the server's words (names, log line, a frame's source)."""
    common = ("spawn_main", "run_scheduler", "CudaGraphRunner.capture")
    ranks = {201: "TP0", 202: "TP1", 203: "TP2", 204: "TP3"}

    def stacks_of(pid: int, rank: str) -> ProcessStacks:
        tail = ("Barrier.wait", "Condition.wait") if rank != "TP3" else ("broadcast", "Condition.wait")
        stack = list(frames(*common, "capture_one" if rank != "TP3" else "broadcast_draft", *tail))
        stack[-1] = dataclasses.replace(stack[-1], code=f"waiter.acquire(){text}")
        return process_stacks(
            pid, f"sglang::scheduler_{rank}{text}", tuple(stack), role="scheduler", rank=rank, state="S"
        )

    samples = [stack_sample(t, *(stacks_of(pid, rank) for pid, rank in ranks.items())) for t in (8.0, 10.0)]
    # Built by hand, not by the analysis: the renderers are tested on the model alone.
    tree = stack_tree(
        chain(
            "TP0-3", (201, 202, 203, 204), *common,
            children=(
                chain("TP0-2", (201, 202, 203), "capture_one", "Barrier.wait", "Condition.wait", text=text),
                chain("TP3", (204,), "broadcast_draft", "broadcast", "Condition.wait", minority=True, text=text),
            ),
        ),
        summary=f"TP0-2 in Barrier.wait > Condition.wait; TP3 in broadcast > Condition.wait (odd one out){text}",
    )  # fmt: skip
    v = verdict(
        State.STALLED,
        cause=Cause.CUDA_GRAPH_CAPTURE,
        phase="cuda_graph (capturing CUDA graphs, for 10 s)",
        summary=f"stalled: nothing progressed for 10 s; TP3 took another path{text}",
        culprits=(204,),
        evidence=("log silent 10 s", f"last line: Capture cuda graph begin{text}"),
        next_steps=("Confirm with --disable-cuda-graph (SGLang).",),
        confidence="high",
    )
    processes = (
        process_record(200, "python -m sglang.launch_server", role="main"),
        *(
            process_record(pid, f"sglang::scheduler_{rank}{text}", ppid=200, role="scheduler", rank=rank)
            for pid, rank in ranks.items()
        ),
    )
    return report(
        v, engine="sglang", processes=processes, stacks=tuple(samples), stack_tree=tree,
        log_path="/tmp/run/output.log", notes=(f"cleanup: 5 processes stopped{text}",),
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


def dense_burst(samples: list[StackSample], total: int = 6, gap: float = 1.0) -> list[StackSample]:
    """The captures as the watch takes them for a busy process found in place: ``samples`` extended to
    ``total`` by Python-level copies of the last one, ``gap`` seconds apart, each process's CPU advanced
    at the rate it burnt over the given samples (a spin stays where it is and keeps burning)."""
    out = list(samples)
    rate = {}
    if len(out) >= 2:
        before = {p.pid: p for p in out[0].processes}
        span = max(out[-1].t - out[0].t, 1e-3)
        for p in out[-1].processes:
            old = before.get(p.pid)
            if p.cpu_s is not None and old is not None and old.cpu_s is not None:
                rate[p.pid] = max(0.0, p.cpu_s - old.cpu_s) / span
    while len(out) < total:
        last = out[-1]
        processes = tuple(
            dataclasses.replace(p, cpu_s=p.cpu_s + rate.get(p.pid, 0.0) * gap) if p.cpu_s is not None else p
            for p in last.processes
        )
        out.append(dataclasses.replace(last, t=last.t + gap, processes=processes))
    return out
