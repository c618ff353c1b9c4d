"""The supervision loop shared by ``run`` and ``attach``: collect a tick, assess it, show it, record it.

Stacks are captured in the loop itself, between ticks, when ``StackHistory`` says one is due (the
tree has gone quiet): a capture round never overlaps a /proc sample, so the tracing stop py-spy
causes for a few milliseconds is never mistaken for a stopped process.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace

from hangwatch.analyse.assess import Assessor
from hangwatch.analyse.logscan import LogScanner
from hangwatch.analyse.stacktree import build_tree
from hangwatch.analyse.stackwatch import StackHistory
from hangwatch.collect.gpm import GpmSource
from hangwatch.collect.http_probe import Prober
from hangwatch.collect.logtail import FileLog
from hangwatch.collect.logtail import LogChunk
from hangwatch.collect.logtail import PipeLog
from hangwatch.collect.nvml import GpuSource
from hangwatch.collect.oom import OomWitness
from hangwatch.collect.proctree import TreeSampler
from hangwatch.collect.serving_metrics import ServingPoller
from hangwatch.collect.stacks import StackDumper
from hangwatch.model.report import REPORT_SCHEMA
from hangwatch.model.report import ProcessRecord
from hangwatch.model.report import Report
from hangwatch.model.report import Verdict
from hangwatch.model.samples import ExitRecord
from hangwatch.model.samples import ProbeResult
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import StackTree
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
    stacks: StackDumper | None = None
    gpm: GpmSource | None = None
    serving: ServingPoller | None = None  # /metrics while serving (F6), run mode without --until-ready


@dataclass
class StackKit:
    """What stack capture needs during a watch, or None parts when it is off or impossible."""

    dumper: StackDumper | None
    gpm: GpmSource | None
    history: StackHistory | None
    notes: tuple[str, ...] = ()

    def close(self) -> None:
        if self.gpm is not None:
            self.gpm.close()


def stack_kit(enabled: bool, gpu_available: bool) -> StackKit:
    if not enabled:
        return StackKit(None, None, None, ("stacks: off (--no-stacks)",))
    dumper = StackDumper()
    if dumper.unavailable is not None:
        return StackKit(None, None, None, (f"stacks: unavailable: {dumper.unavailable}",))
    gpm = GpmSource() if gpu_available else None
    return StackKit(dumper, gpm, StackHistory())


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
        *,
        on_members: Callable[[set[tuple[int, int]]], None] | None = None,
        history: StackHistory | None = None,
    ) -> None:
        self.c = collectors
        self.scanner = scanner
        self.assessor = assessor
        self.view = view
        self.interval = interval_s
        self.on_members = on_members
        self.history = history
        self.resumed: list[str] = []  # processes a dump left stopped and we resumed (for the notes)
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
                ExitRecord(**{**e.__dict__, "oom_evidence": self.c.oom.evidence_for(e.pid)})
                if e.signal == 9
                else e
                for e in exits
            )
        return Tick(
            t=t,
            processes=reading.processes,
            exits=exits,
            log=log,
            probes=probes,
            gpu=gpu,
            serving=self.c.serving.take() if self.c.serving is not None else None,
            errors=reading.errors,
        )

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
            history = self._stack_history()
            if history is not None:
                history.observe_gpu(tick.gpu)
                if verdict is not None and verdict.state is State.STALLED and not history.spell:
                    # The window ran out before any stack was taken: take one now, name the cause with it.
                    self.capture_stacks(tick, history)
                    verdict = self.assessor.stalled_now(tick)
                elif verdict is None:
                    a = self.assessor
                    if history.due(tick.t, a.solid_clock.last_progress_t, a.clock.last_progress_t):
                        self.capture_stacks(tick, history)
            if verdict is not None:
                self.view.event(f"verdict {verdict.headline}")
                if until(verdict):
                    return verdict
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay < 0:  # we fell behind (a slow /proc or NVML): do not try to catch up in a burst
                next_at = time.monotonic()
                delay = 0
            if self.stop_requested.wait(delay):
                return self.interrupted()

    def _stack_history(self) -> StackHistory | None:
        if self.c.stacks is None or self.c.stacks.unavailable is not None:
            return None
        return self.history

    def capture_stacks(self, tick: Tick, history: StackHistory) -> None:
        """One capture round over the tree's live processes, with GPM metrics since the previous round."""
        assert self.c.stacks is not None
        # Stamped with the tick's time so that samples stay on the tick grid ("2 s apart" is 2 ticks).
        sample = self.c.stacks.capture(tick.processes, tick.t, native=history.wants_native())
        if self.c.gpm is not None:
            sample = replace(sample, gpus=self.c.gpm.read(), gpm_unavailable=self.c.gpm.unavailable)
        history.add(sample)
        for p in sample.processes:
            if p.resumed:
                self.resumed.append(
                    f"{p.name} [{p.pid}] was left stopped by a stack dump and resumed (SIGCONT)"
                )
                self.view.event(self.resumed[-1])
        if len(history.spell) == 1:
            tree = build_tree([sample])
            self.view.event(
                f"{tick.t:.1f}s quiet: took stacks ({sample.elapsed_s:.1f} s): {tree.summary[:300]}"
            )

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

    def report(
        self, verdict: Verdict, engine: str, mode: str, command: tuple[str, ...], notes: tuple[str, ...]
    ) -> Report:
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
            notes=notes + tuple(dict.fromkeys(self.resumed)),
            stacks=tuple(self.history.kept) if self.history is not None else (),
            stack_tree=self._stack_tree(verdict),
        )

    def _stack_tree(self, verdict: Verdict) -> StackTree | None:
        if self.history is None or not self.history.kept:
            return None
        samples = self.history.samples_for_analysis() or self.history.kept[-1:]
        return build_tree(samples, highlight=verdict.culprits or None)
