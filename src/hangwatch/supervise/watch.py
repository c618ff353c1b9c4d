"""The supervision loop shared by ``run`` and ``attach``: collect a tick, assess it, show it, record it."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field

from hangwatch.analyse.assess import Assessor
from hangwatch.analyse.logscan import LogScanner
from hangwatch.collect.http_probe import Prober
from hangwatch.collect.logtail import FileLog
from hangwatch.collect.logtail import LogChunk
from hangwatch.collect.logtail import PipeLog
from hangwatch.collect.nvml import GpuSource
from hangwatch.collect.oom import OomWitness
from hangwatch.collect.proctree import TreeSampler
from hangwatch.model.report import REPORT_SCHEMA
from hangwatch.model.report import ProcessRecord
from hangwatch.model.report import Report
from hangwatch.model.report import Verdict
from hangwatch.model.samples import ExitRecord
from hangwatch.model.samples import ProbeResult
from hangwatch.model.samples import Tick
from hangwatch.model.vocabulary import State
from hangwatch.render.live import LiveState
from hangwatch.render.live import View

MAX_TIMELINE_TICKS = 3600  # older ticks are thinned to every other one beyond this


@dataclass
class Collectors:
    tree: TreeSampler
    log: PipeLog | FileLog | None
    prober: Prober | None
    gpu: GpuSource
    oom: OomWitness | None = None


@dataclass
class Recorder:
    """Everything the report needs, accumulated tick by tick."""

    timeline: list[Tick] = field(default_factory=list)
    probes: list[ProbeResult] = field(default_factory=list)
    processes: dict[int, ProcessRecord] = field(default_factory=dict)

    def add(self, tick: Tick) -> None:
        self.timeline.append(tick)
        if len(self.timeline) > MAX_TIMELINE_TICKS:
            half = len(self.timeline) // 2
            self.timeline = self.timeline[:half:2] + self.timeline[half:]
        self.probes.extend(tick.probes)
        for p in tick.processes:
            old = self.processes.get(p.pid)
            self.processes[p.pid] = ProcessRecord(
                pid=p.pid,
                ppid=p.ppid,
                name=p.name,
                cmdline=p.cmdline,
                role=p.role,
                rank=p.rank,
                state=p.state,
                exit_code=None,
                first_seen=old.first_seen if old else tick.t,
                last_seen=tick.t,
            )
        for e in tick.exits:
            self._record_exit(e)

    def _record_exit(self, e: ExitRecord) -> None:
        old = self.processes.get(e.pid)
        code = -e.signal if e.signal is not None else e.exit_code
        self.processes[e.pid] = ProcessRecord(
            pid=e.pid,
            ppid=old.ppid if old else 0,
            name=e.name,
            cmdline=old.cmdline if old else (),
            role=e.role,
            rank=e.rank,
            state="gone",
            exit_code=code,
            exit_how=e.how.value,
            first_seen=old.first_seen if old else e.t,
            last_seen=e.t,
        )


class Watch:
    def __init__(
        self,
        collectors: Collectors,
        scanner: LogScanner,
        assessor: Assessor,
        view: View,
        interval_s: float = 1.0,
        on_members: Callable[[set[tuple[int, int]]], None] | None = None,
    ) -> None:
        self.c = collectors
        self.scanner = scanner
        self.assessor = assessor
        self.view = view
        self.interval = interval_s
        self.on_members = on_members
        self.recorder = Recorder()
        self.stop_requested = threading.Event()
        self.started_wall = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self._t0 = time.monotonic()
        self._phase_shown = ""

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def tick(self) -> Tick:
        t = round(self.elapsed(), 3)
        reading = self.c.tree.sample(t)
        chunk = self.c.log.drain() if self.c.log is not None else LogChunk((), 0)
        log = self.scanner.scan(chunk.lines, chunk.new_bytes, t)
        probes = self.c.prober.drain() if self.c.prober is not None else ()
        gpu = self.c.gpu.read()
        exits = reading.exits
        if self.c.oom is not None:
            exits = tuple(
                ExitRecord(**{**e.__dict__, "oom_evidence": self.c.oom.evidence_for(e.pid)}) if e.signal == 9 else e
                for e in exits
            )
        return Tick(t=t, processes=reading.processes, exits=exits, log=log, probes=probes, gpu=gpu, errors=reading.errors)

    def run(self, until: Callable[[Verdict], bool]) -> Verdict:
        """Loop until ``until(verdict)`` says stop, or a stop is requested (Ctrl-C, SIGTERM)."""
        next_at = time.monotonic()
        while True:
            tick = self.tick()
            verdict = self.assessor.observe(tick)
            self.recorder.add(tick)
            if self.on_members is not None:
                self.on_members(self.c.tree.identities())
            self._show(tick)
            if verdict is not None:
                self.view.event(f"verdict {verdict.state.value}: {verdict.summary}")
                if until(verdict):
                    return verdict
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay < 0:  # we fell behind (a slow /proc or NVML): do not try to catch up in a burst
                next_at = time.monotonic()
                delay = 0
            if self.stop_requested.wait(delay):
                return self.interrupted()

    def interrupted(self) -> Verdict:
        a = self.assessor
        return Verdict(
            State.INTERRUPTED,
            None,
            a.phases.describe(a.now),
            f"interrupted by the user after {a.now:.0f} s, before a verdict",
            (),
            (f"last progress {a.clock.quiet_for(a.now):.0f} s ago",),
        )

    def _show(self, tick: Tick) -> None:
        a = self.assessor
        current = a.phases.current
        if current.name != self._phase_shown:
            self._phase_shown = current.name
            if current.line or current.name == "ready":
                self.view.event(f"{tick.t:.1f}s phase {current.name}: {current.label}")
        gpu_mem: dict[int, int] = {}
        if tick.gpu is not None:
            for p in tick.gpu.processes:
                gpu_mem[p.pid] = gpu_mem.get(p.pid, 0) + (p.used_bytes or 0)
        last = a.clock.last_signals
        self.view.update(
            LiveState(
                t=tick.t,
                phase=current.name,
                phase_label=current.label,
                in_phase_s=tick.t - current.start,
                processes=tick.processes,
                interval_s=self.interval,
                probe=a.last_probe,
                time_to_stall_s=None if a.serving else a.time_to_stall(),
                gpu=tick.gpu,
                gpu_mem_by_pid=gpu_mem,
                last_progress=(
                    f"{a.clock.quiet_for(tick.t):.0f} s ago ({last[0].text})" if last else "none yet"
                ),
            )
        )

    def report(self, verdict: Verdict, engine: str, mode: str, command: tuple[str, ...], notes: tuple[str, ...]) -> Report:
        end = self.assessor.now
        return Report(
            schema=REPORT_SCHEMA,
            engine=engine,
            mode=mode,
            command=command,
            started_at=self.started_wall,
            duration_s=round(end, 3),
            log_path=str(self.c.log.path) if self.c.log is not None else None,
            verdict=verdict,
            phases=self.assessor.phases.spans(end),
            processes=tuple(sorted(self.recorder.processes.values(), key=lambda p: p.first_seen)),
            probes=tuple(self.recorder.probes),
            timeline=tuple(self.recorder.timeline),
            notes=notes,
        )
