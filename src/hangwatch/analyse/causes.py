"""Rules that name a cause from process states, exit statuses and log findings.

Each rule is a small named function over model objects. Stack-based rules plug in beside them.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass

from hangwatch.model.samples import ExitHow
from hangwatch.model.samples import ExitRecord
from hangwatch.model.samples import LogFinding
from hangwatch.model.samples import Tick
from hangwatch.model.vocabulary import Cause

SHORT_LIVED_S = 2.0  # helpers (`which`, `ldconfig -p`, compiler probes) exit non-zero harmlessly

NEXT_STEPS: dict[Cause, tuple[str, ...]] = {
    Cause.STOPPED: (
        "A stopped process (state T) stops its peers: resume it with `kill -CONT PID` if that was not "
        "intended, or check whether a debugger or job control stopped it.",
    ),
    Cause.IO_WAIT: (
        "Processes sit in uninterruptible I/O (state D): check the filesystem the weights or caches are on "
        "(`cat /proc/PID/wchan`, `dmesg`), and network mounts.",
    ),
    Cause.DEAD_PEER: (
        "A process of the tree died and its peers wait for it forever: read its last log lines; "
        "`dmesg -T | grep -i oom` if it was killed by SIGKILL.",
    ),
    Cause.OOM_KILLED: (
        "The kernel OOM killer ended a process: give the host more RAM, load fewer shards at once, "
        "or lower the engine's CPU memory (swap space, pinned memory, workers).",
    ),
    Cause.CUDA_OOM: (
        "The GPU ran out of memory: lower --gpu-memory-utilization / --mem-fraction-static, "
        "--max-model-len or the CUDA graph batch sizes, and check no stale process holds GPU memory.",
    ),
    Cause.PORT_IN_USE: (
        "The port is taken: find the owner with `ss -ltnp 'sport = :PORT'`; a previous server may still be "
        "running (hangwatch cleanup --port PORT stops that tree).",
    ),
    Cause.EXCEPTION: ("Read the traceback above; the first exception in the log is usually the root cause.",),
    Cause.UNKNOWN: (
        "Take stacks of every rank (`hangwatch stacks --pid PID`, or `py-spy dump --pid PID` for each) to see "
        "where each process waits.",
    ),
}


@dataclass(frozen=True)
class Diagnosis:
    cause: Cause
    culprits: tuple[int, ...]
    explanation: str


def is_significant_failure(exit_: ExitRecord, is_root: bool) -> bool:
    """A death that matters: the launched command, any death by signal, or a failed long-lived process."""
    if not exit_.failed:
        return False
    if is_root or exit_.signal is not None:
        return True
    return exit_.role is not None or exit_.rank is not None or (exit_.lifetime_s or 0.0) >= SHORT_LIVED_S


def stopped_processes(tick: Tick) -> tuple[int, ...]:
    """Rule ``stopped``: processes in state T (job control) or t (stopped by a tracer)."""
    return tuple(p.pid for p in tick.processes if p.state in ("T", "t"))


def io_waiting_processes(window: Sequence[Tick], share: float = 0.8) -> tuple[int, ...]:
    """Rule ``io-wait``: processes in uninterruptible sleep (D) for most of the window."""
    if not window:
        return ()
    counts: dict[int, int] = {}
    for tick in window:
        for p in tick.processes:
            if p.state == "D":
                counts[p.pid] = counts.get(p.pid, 0) + 1
    return tuple(sorted(pid for pid, n in counts.items() if n >= share * len(window)))


def diagnose_stall(window: Sequence[Tick], findings: Sequence[LogFinding]) -> Diagnosis:
    """Name the cause of a stall from states and log text alone (stacks refine ``unknown``)."""
    last = window[-1]
    stopped = stopped_processes(last)
    if stopped:
        names = _names(last, stopped)
        return Diagnosis(Cause.STOPPED, stopped, f"{names} stopped (state T); the rest of the tree waits for it")
    in_d = io_waiting_processes(window)
    if in_d:
        return Diagnosis(Cause.IO_WAIT, in_d, f"{_names(last, in_d)} in uninterruptible I/O (state D)")
    by_cause = {f.cause: f for f in findings}
    for cause in (Cause.CUDA_OOM, Cause.PORT_IN_USE, Cause.EXCEPTION):
        if cause in by_cause:
            return Diagnosis(cause, (), f"the log reported it and nothing moved since: {by_cause[cause].line[:200]}")
    return Diagnosis(Cause.UNKNOWN, (), "no process state or log line names a cause")


def diagnose_crash(
    failures: Sequence[ExitRecord], findings: Sequence[LogFinding], root_pids: set[int]
) -> Diagnosis:
    """Name the cause of a crash from the first significant death and the log findings."""
    first = failures[0]
    culprits = tuple(dict.fromkeys(f.pid for f in failures))
    by_cause = {f.cause: f for f in findings}
    death = f"{first.name} [{first.pid}] {first.status_text}"
    if Cause.CUDA_OOM in by_cause:
        return Diagnosis(Cause.CUDA_OOM, culprits, f"{death} after: {by_cause[Cause.CUDA_OOM].line[:200]}")
    killed = [f for f in failures if f.signal == signal.SIGKILL and f.oom_evidence]
    if killed:
        k = killed[0]
        return Diagnosis(Cause.OOM_KILLED, (k.pid,), f"{k.name} [{k.pid}] was OOM-killed: {k.oom_evidence}")
    if Cause.PORT_IN_USE in by_cause:
        return Diagnosis(Cause.PORT_IN_USE, culprits, f"{death}: {by_cause[Cause.PORT_IN_USE].line[:200]}")
    if first.pid not in root_pids and Cause.EXCEPTION not in by_cause:
        note = ""
        if first.signal == signal.SIGKILL:
            note = " (SIGKILL: possibly the OOM killer; no kernel or cgroup record was readable)"
        return Diagnosis(Cause.DEAD_PEER, (first.pid,), f"{death}{note}; the rest of the tree waits for it")
    if Cause.EXCEPTION in by_cause:
        summary = _exception_summary(findings)
        return Diagnosis(Cause.EXCEPTION, culprits, f"{death} after an exception: {summary}")
    if first.signal == signal.SIGKILL:
        return Diagnosis(
            Cause.UNKNOWN, culprits, f"{death}: possibly the OOM killer, but no kernel or cgroup record was readable"
        )
    if first.how is ExitHow.VANISHED:
        return Diagnosis(Cause.UNKNOWN, culprits, f"{death}")
    return Diagnosis(Cause.UNKNOWN, culprits, f"{death} without a traceback or known message in the log")


def _exception_summary(findings: Sequence[LogFinding]) -> str:
    """The line naming the exception (``ValueError: ...``), not the ``Traceback`` header."""
    lines = [f.line for f in findings if f.cause is Cause.EXCEPTION and not f.line.lstrip().startswith("Traceback")]
    if not lines:
        lines = [f.line for f in findings if f.cause is Cause.EXCEPTION]
    return lines[-1][:300] if lines else "see the log"


def _names(tick: Tick, pids: tuple[int, ...]) -> str:
    parts = []
    for pid in pids:
        p = tick.process(pid)
        parts.append(f"{p.name} [{pid}]" if p else f"[{pid}]")
    return ", ".join(parts)
