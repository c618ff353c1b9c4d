"""The supervision loop shared by ``run`` and ``attach``: collect a tick, assess it, show it, record it.

The loop reads nothing of the analysis but what ``Assessor`` hands it (a verdict, a ``Status``, and
whether it wants stacks); ``build_watch`` wires the same collectors, analysis and clock for both.

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
from urllib.parse import urlsplit

from hangwatch.analyse.assess import Assessor
from hangwatch.analyse.causes import ports_in_line
from hangwatch.analyse.flightrecorder import refine_with_flight_recorder
from hangwatch.analyse.gpukernels import kernel_notes
from hangwatch.analyse.gpukernels import refine as refine_with_kernels
from hangwatch.analyse.gpustate import ambiguous
from hangwatch.analyse.ncclras import RULE as RAS_RULE
from hangwatch.analyse.ncclras import ras_findings
from hangwatch.analyse.nextsteps import StepFacts
from hangwatch.analyse.nextsteps import fit
from hangwatch.analyse.stacktree import build_tree
from hangwatch.analyse.stackwatch import StackHistory
from hangwatch.collect import flightrecorder
from hangwatch.collect import ncclras
from hangwatch.collect import procfs
from hangwatch.collect.connections import ConnectionWatcher
from hangwatch.collect.cudagdb import KernelReader
from hangwatch.collect.gpm import GpmSource
from hangwatch.collect.http_probe import Prober
from hangwatch.collect.logtail import FileLog
from hangwatch.collect.logtail import PipeLog
from hangwatch.collect.nvml import GpuSource
from hangwatch.collect.nvml import NvmlGpuSource
from hangwatch.collect.oom import OomWitness
from hangwatch.collect.own_request import OwnRequester
from hangwatch.collect.proctree import TreeSampler
from hangwatch.collect.serving_metrics import ServingPoller
from hangwatch.collect.stacks import StackDumper
from hangwatch.engines import registry
from hangwatch.engines.profile import int_flag
from hangwatch.model.flightrecorder import FlightCapture
from hangwatch.model.gpukernels import KernelSample
from hangwatch.model.history import PhaseHistory
from hangwatch.model.ncclras import RasSnapshot
from hangwatch.model.report import REPORT_SCHEMA
from hangwatch.model.report import PhaseSpan
from hangwatch.model.report import ProcessRecord
from hangwatch.model.report import Report
from hangwatch.model.report import Verdict
from hangwatch.model.samples import ExitRecord
from hangwatch.model.samples import GpuSample
from hangwatch.model.samples import LogLines
from hangwatch.model.samples import ProbeResult
from hangwatch.model.samples import ProcessId
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import StackSample
from hangwatch.model.status import StackRequest
from hangwatch.model.status import Status
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import State
from hangwatch.pacing import Pacer
from hangwatch.render.history_text import usual_range
from hangwatch.render.live import LiveState
from hangwatch.render.live import View
from hangwatch.supervise.clock import WatchClock
from hangwatch.supervise.plan import Plan
from hangwatch.supervise.plan import WatchOptions
from hangwatch.supervise.plan import make_assessor
from hangwatch.supervise.plan import make_own_requester
from hangwatch.supervise.plan import make_prober
from hangwatch.supervise.plan import make_scanner
from hangwatch.supervise.plan import make_serving_poller
from hangwatch.words import plural

# NCCL RAS is read twice at a stall, at least this far apart: counts that do not move in 3 s while
# collectives run at thousands a second are frozen.
RAS_GAP_S = 3.0
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
    connections: ConnectionWatcher | None = None  # the server's client connections while serving
    own: OwnRequester | None = None  # hangwatch's own one-token completion while serving (run only)
    # GPM read every tick on the GPUs the tree holds (its own source: the captures' keeps their interval).
    gpm_ticks: GpmSource | None = None

    def close_gpm(self) -> None:
        """Release the tick's GPM source (NVML); after the last tick, the tear-down's included."""
        if self.gpm_ticks is not None:
            self.gpm_ticks.close()

    def stop_threads(self) -> None:
        """Stop the collectors that run threads of their own (probes, scrapes)."""
        if self.prober is not None:
            self.prober.stop()
        if self.serving is not None:
            self.serving.stop()


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
    dumper = StackDumper(engine_caches=registry.cache_folders())
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
        if len(self.probes) > MAX_TIMELINE_TICKS:  # a sidecar watches for days: the latest are kept
            del self.probes[: len(self.probes) - MAX_TIMELINE_TICKS]
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
    """The loop: collect a tick, hand it to the analysis, capture stacks when it asks, show its status."""

    def __init__(
        self,
        collectors: Collectors,
        assessor: Assessor,
        view: View,
        clock: WatchClock,
        *,
        interval_s: float = 1.0,
        on_members: Callable[[set[ProcessId]], None] | None = None,
    ) -> None:
        self.c = collectors
        self.assessor = assessor
        self.view = view
        self.clock = clock
        self.interval = interval_s
        self.on_members = on_members
        # Hears every tick and the status the analysis gave it (the sidecar keeps its reading from them).
        self.on_status: Callable[[Tick, Status], None] | None = None
        self.captures = 0  # stack captures taken, and their total time: what watching costs the tree
        self.capture_s = 0.0
        self.resumed: list[str] = []  # processes a dump left stopped and we resumed (for the notes)
        self.late: list[float] = []  # how late each tick that came a whole interval or more late was
        self.recorder = Recorder()
        self.stop_requested = threading.Event()
        self.stopped_by: str | None = None  # "SIGTERM", "Ctrl-C": set by whoever asked the loop to stop
        self.started_wall = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self._phase_shown = ""
        # Each phase's usual duration in earlier boots (WatchOptions.phase_usual): said beside the phase.
        self.usual: dict[str, PhaseHistory] = {}
        self._hint_shown: str | None = None
        # What the live line says happens after the verdict that ends the loop ("stopping the tree");
        # None: nothing said there, the verdict block follows at once (attach).
        self.final_words: str | None = None
        # Whether a process of the tree loaded NCCL (its advice is given only then): read while the tree
        # is alive, by note_libraries (run reads it before its clean-up), or at report time (attach).
        self.nccl: bool | None = None
        self.roots: set[int] = set()  # the pids the watch started from (build_watch)
        self.kernels: KernelSample | None = None  # the GPU's running kernels, read at a gpu-spin verdict
        self.flight: FlightCapture | None = None  # the ranks' Flight Recorder dumps, read at a stall
        self.ras: tuple[RasSnapshot, ...] = ()  # NCCL RAS's two readings at a stall
        self.started_unix = time.time()  # a dump older than the watch is an earlier run's
        self.kept_running = False  # run --keep-running: a stall left the tree running for a look
        self.kernel_names = False  # whether name_kernels reads them (WatchOptions.kernel_names)
        self._connections_from: float | None = None  # the analysis' wish for the server's connections

    def elapsed(self) -> float:
        return self.clock()

    def tick(self, late_s: float = 0.0) -> Tick:
        """Everything collected now, raw; ``late_s``: how far behind its schedule the loop takes it."""
        t = round(self.elapsed(), 3)
        reading = self.c.tree.sample(t)
        if reading.exits and isinstance(self.c.log, PipeLog):
            self.c.log.settle()  # the last words of what just ended are evidence of why
        lines = self.c.log.drain() if self.c.log is not None else LogLines()
        probes = self.c.prober.drain() if self.c.prober is not None else ()
        gpu = self._gpu_reading({p.pid for p in reading.processes})
        exits = reading.exits
        if self.c.oom is not None:
            exits = tuple(
                ExitRecord(**{**e.__dict__, "oom_evidence": self.c.oom.evidence_for(e.pid)})
                if e.signal == 9
                else e
                for e in exits
            )
        connections = None
        wanted_from = self._connections_from
        if self.c.connections is not None and wanted_from is not None and t >= wanted_from:
            connections = self.c.connections.read(
                (p for proc in reading.processes for p in proc.listening_ports),
                [proc.pid for proc in reading.processes],
            )
        return Tick(
            t=t,
            processes=reading.processes,
            exits=exits,
            logs=(replace(lines, marks=self.c.prober.marks()) if self.c.prober is not None else lines,),
            probes=probes,
            gpu=gpu,
            serving=self.c.serving.take() if self.c.serving is not None else None,
            connections=connections,
            own_request=self.c.own.latest() if self.c.own is not None else None,
            late_s=late_s,
        )

    def run(
        self,
        until: Callable[[Verdict], bool],
        on_change: Callable[[Verdict | None, float], bool] | None = None,
    ) -> Verdict:
        """Loop until ``until(verdict)`` says stop, or a stop is requested (Ctrl-C, SIGTERM).

        A verdict the loop goes on after (ready while serving, a stall under ``run --keep-running``) is
        said once, and again only when it changes (another state, cause or culprit); ``on_change`` hears
        each such verdict (True: it printed it itself), and ``None`` when the tree progresses again after
        a stall (a recovery).
        The verdict that ends the loop is said by whoever prints the verdict block, once: the live line
        here says only that it came, and ``final_words`` what happens next (``run``: the tree is stopped).
        """
        standing: Verdict | None = None
        pacer = Pacer(self.interval, self.stop_requested.wait)
        while True:
            tick = self.tick(late_s=pacer.late_s())
            if tick.late_s >= self.interval:
                self.late.append(tick.late_s)
            verdict = self.assessor.observe(tick)
            request = self.assessor.stacks_wanted()
            if request is not StackRequest.NONE and self.c.stacks is not None:
                verdict = self.assessor.observe_stacks(self.capture_stacks(tick, request)) or verdict
            status = self.assessor.status()
            tick = status.tick or tick  # as the analysis read it
            self.recorder.add(tick)
            self.c.tree.learn_titles(status.titles)
            self._connections_from = status.connections_from_t
            if self.on_members is not None:
                self.on_members(self.c.tree.identities())
            if self.on_status is not None:
                self.on_status(tick, status)
            if status.ask and self.c.own is not None:
                self.c.own.ask()
            self._show(tick, status)
            if verdict is not None:
                if until(verdict):
                    if self.final_words is not None:
                        self.view.event(f"{state_and_cause(verdict)} at {tick.t:.1f} s: {self.final_words}")
                    return verdict
                if not same_reading(verdict, standing):
                    standing = verdict
                    # Said in full by on_change (a block) or here in one line, never both.
                    if on_change is None or not on_change(verdict, tick.t):
                        self.view.event(f"verdict {verdict.headline}")
            elif standing is not None and standing.state is State.STALLED:
                # Progress again after a stall the tree was kept running through: said, and the next
                # stall (if one comes) is a new verdict.
                standing = None
                status_now = self.assessor.status()
                self.view.event(f"{tick.t:.1f}s progress again: last progress {status_now.last_progress}")
                if on_change is not None:
                    on_change(None, tick.t)
            if pacer.wait():
                return self.interrupted()

    def record_last(self) -> None:
        """One more tick recorded, read but not judged (the verdict stands): the exits a clean-up caused."""
        self.recorder.add(self.assessor.read(self.tick()))

    def observe_last(self) -> Verdict | None:
        """One more tick judged and recorded, after the loop ended: a death after its last tick."""
        verdict = self.assessor.observe(self.tick())
        status = self.assessor.status()
        if status.tick is not None:
            self.recorder.add(status.tick)
        return verdict

    def capture_stacks(self, tick: Tick, request: StackRequest) -> StackSample:
        """One capture round over the tree's live processes, with GPM metrics since the previous round."""
        assert self.c.stacks is not None
        # Stamped with the tick's time so that samples stay on the tick grid ("2 s apart" is 2 ticks).
        sample = self.c.stacks.capture(tick.processes, tick.t, native=request is StackRequest.NATIVE)
        self.captures += 1
        self.capture_s += sample.elapsed_s
        if self.c.gpm is not None:
            sample = replace(sample, gpus=self.c.gpm.read(), gpm_unavailable=self.c.gpm.unavailable)
        for p in sample.processes:
            if p.resumed:
                self.resumed.append(
                    f"{p.name} [{p.pid}] was left stopped by a stack dump and resumed (SIGCONT)"
                )
                self.view.event(self.resumed[-1])
        if self.assessor.spell_unsampled():
            tree = build_tree([sample])
            self.view.event(
                f"{tick.t:.1f}s quiet: took stacks ({sample.elapsed_s:.1f} s): {tree.summary[:300]}"
            )
        return sample

    def _gpu_reading(self, members: set[int]) -> GpuSample:
        """NVML's reading, with GPM's pipes since the last tick on each GPU a member holds memory on: work
        that moves little memory (a GEMM in L2) is told from a spin every tick, not only at captures."""
        gpu = self.c.gpu.read()
        held = {p.gpu_index for p in gpu.processes if p.pid in members}
        # Only where NVML cannot tell work from a spin (kernels running, little memory moved): a read costs
        # 1.8 ms a GPU on an H200, 1.4 % of a core a second on eight; an idle GPU or one moving memory needs
        # none.
        held = {g.index for g in gpu.gpus if g.index in held and ambiguous(g)}
        if self.c.gpm_ticks is None or not held:
            return gpu
        # A sample older than 2.5 ticks is a gap (the GPU was not read meanwhile): started again, not used.
        activity = self.c.gpm_ticks.read(held, max_interval_s=2.5 * self.interval)
        return replace(gpu, activity=activity) if activity else gpu

    def interrupted(self) -> Verdict:
        if self.stopped_by in (None, "Ctrl-C"):
            return self.assessor.interrupted("interrupted by the user (Ctrl-C)")
        return self.assessor.interrupted(f"stopped by {self.stopped_by}")

    def _show(self, tick: Tick, status: Status) -> None:
        if status.phase != self._phase_shown:
            self._phase_shown = status.phase
            if status.phase_line or status.phase == "ready":
                usual = self.usual.get(status.phase)
                was = f" ({usual_range(usual)})" if usual is not None else ""
                self.view.event(f"{tick.t:.1f}s phase {status.phase}: {status.phase_label}{was}")
        if status.hint != self._hint_shown:
            self._hint_shown = status.hint
            if status.hint:
                self.view.event(f"{tick.t:.1f}s {status.hint}")
        gpu_mem: dict[int, int] = {}
        if tick.gpu is not None:
            for p in tick.gpu.processes:
                gpu_mem[p.pid] = gpu_mem.get(p.pid, 0) + (p.used_bytes or 0)
        self.view.update(
            LiveState(
                t=tick.t,
                phase=status.phase,
                phase_label=status.phase_label,
                in_phase_s=status.in_phase_s,
                processes=tick.processes,
                interval_s=self.interval,
                probe=status.probe,
                time_to_stall_s=status.time_to_stall_s,
                gpu=tick.gpu,
                gpu_mem_by_pid=gpu_mem,
                last_progress=status.last_progress,
                usual=self.usual.get(status.phase),
            )
        )

    def note_libraries(self) -> None:
        """Read what only a live tree shows (its mapped libraries), for the next steps; once."""
        if self.nccl is not None:
            return
        seen = [procfs.maps_library(pid, "libnccl") for pid in sorted(self.c.tree.known_pids())]
        if any(seen):
            self.nccl = True
        elif seen and all(s is False for s in seen):
            self.nccl = False  # every map read, none with NCCL; unreadable ones leave it unknown
        if self.nccl is None and any(
            "nccl" in f.name.lower() for s in self.assessor.stack_samples() for f in _frames(s)
        ):
            self.nccl = True

    def name_kernels(self, verdict: Verdict, reader: KernelReader | None = None) -> Verdict:
        """A ``gpu-spin`` verdict with the running kernels of the tree's GPU processes named by cuda-gdb,
        read while the tree is alive (each process's host is paused for seconds, its GPU runs on); any
        other verdict as it is, and every verdict where ``kernel_names`` is off or the watch was stopped.
        ``run`` reads them before its tear-down by default, ``attach`` only when asked to (a pause of a
        server hangwatch did not start)."""
        if not self.kernel_names or self.stopped_by is not None or verdict.cause is not Cause.GPU_SPIN:
            return verdict
        reader = reader if reader is not None else KernelReader()
        pids = self._gpu_members(verdict)
        if reader.debugger is not None:
            self.view.event(
                "naming the GPU's kernels: cuda-gdb attaches to "
                f"{plural(len(pids), 'process', 'processes')}, pausing each for seconds"
            )
        self.kernels = reader.capture(pids, round(self.elapsed(), 3))
        quiet = self.assessor.now - self.assessor.last_progress_t()
        return refine_with_kernels(verdict, self.kernels, self._label, quiet)

    def read_collectives(self, verdict: Verdict) -> Verdict:
        """A stall with what the collectives' own records say of it, read while the tree is alive:

        - torch's Flight Recorder: every rank whose environment turns it on is asked for its dump through
          its pipe (NCCL; the rank runs on) and the dumps read, within ``flightrecorder.DUMP_WAIT_S``;
        - NCCL's RAS service, where a member of the tree listens on its port: read before and after that
          (at least ``RAS_GAP_S`` apart), its counts compared.

        A tree with neither costs nothing. Not after a stop (Ctrl-C): the user asked for the verdict now."""
        if verdict.state is not State.STALLED or self.stopped_by is not None or not self.recorder.timeline:
            return verdict
        processes = self.recorder.timeline[-1].processes  # the tick of the verdict
        found = flightrecorder.targets(processes)
        ras_at = ncclras.service_address(processes)
        first = self._ras_reading(ras_at) if ras_at is not None else None
        if found:
            if any(t.pipe is not None for t in found):
                self.view.event(f"asking {plural(len(found), 'rank')} for their Flight Recorder (about 5 s)")
            self.flight = flightrecorder.capture(found, not_before=self.started_unix)
            verdict = refine_with_flight_recorder(verdict, self.flight)
        if isinstance(first, RasSnapshot) and ras_at is not None:
            time.sleep(max(0.0, RAS_GAP_S - (self.elapsed() - first.t)))
            second = self._ras_reading(ras_at)
            if isinstance(second, RasSnapshot):
                self.ras = (first, second)
                said = ras_findings(first, second)
                if said:
                    verdict = replace(
                        verdict,
                        evidence=(*said, *verdict.evidence),
                        decided_by=(*verdict.decided_by, RAS_RULE),
                    )
            else:
                verdict = replace(verdict, evidence=(*verdict.evidence, f"NCCL RAS: {second}"))
        elif first is not None:
            verdict = replace(verdict, evidence=(*verdict.evidence, f"NCCL RAS: {first}"))
        return verdict

    def _ras_reading(self, at: tuple[str, int]) -> RasSnapshot | str:
        try:
            return ncclras.query(at[0], at[1], round(self.elapsed(), 3))
        except ncclras.RasUnavailable as exc:
            return str(exc)

    def _gpu_members(self, verdict: Verdict) -> list[int]:
        """The tree's processes that hold GPU memory (NVML), by rank; the verdict's culprits where NVML
        names none (a container's pid namespace)."""
        last = self.recorder.timeline[-1] if self.recorder.timeline else None
        members = {p.pid for p in last.processes} if last is not None else set()
        on_gpu = {g.pid for g in last.gpu.processes} if last is not None and last.gpu is not None else set()
        chosen = members & on_gpu or set(verdict.culprits)
        records = self.recorder.processes
        return sorted(chosen, key=lambda pid: (records[pid].rank or "") if pid in records else "")

    def _label(self, pid: int) -> str:
        p = self.recorder.processes.get(pid)
        if p is None:
            return f"[{pid}]"
        if not p.rank:
            return f"{p.name} [{pid}]"
        return f"rank {p.rank} [{pid}]" if p.role in (None, "rank") else f"{p.role}/{p.rank} [{pid}]"

    def _root_records(self) -> list[ProcessRecord]:
        return [self.recorder.processes[pid] for pid in sorted(self.roots) if pid in self.recorder.processes]

    def step_facts(self, verdict: Verdict, tree_alive: bool) -> StepFacts:
        port = None
        probe = self.c.prober.url if self.c.prober is not None else None
        if probe is not None:
            port = urlsplit(probe).port
        elif self.recorder.timeline:
            # No probe: the port the tree listens on is where a request would go.
            ports = [p for proc in self.recorder.timeline[-1].processes for p in proc.listening_ports]
            port = ports[0] if ports else None
        if verdict.cause is Cause.PORT_IN_USE:
            # The port the bind was refused on, as the line quoted says: the one to look up (not the probe's,
            # which is the same only when the server was told to bind where it is probed).
            refused = [port for text in (verdict.summary, *verdict.evidence) for port in ports_in_line(text)]
            # Python's "[Errno 98] Address already in use" names none: the port the command was told to take.
            told = [int_flag(p.cmdline, "--port", default=0) for p in self._root_records()]
            port = refused[0] if refused else next((t for t in told if 0 < t < 65536), port)
        root = min(self.roots) if self.roots else None
        pid = verdict.culprits[0] if verdict.culprits else root
        return StepFacts(
            pid=pid, port=port, tree_alive=tree_alive, nccl=self.nccl, kept_running=self.kept_running
        )

    def report(
        self,
        verdict: Verdict,
        engine: str,
        mode: str,
        command: tuple[str, ...],
        notes: tuple[str, ...],
        *,
        tree_alive: bool = True,
    ) -> Report:
        """The report of this watch so far; its next steps fitted to what is known (analyse/nextsteps),
        ``tree_alive`` False once run has stopped the tree."""
        if tree_alive:
            self.note_libraries()
        verdict = replace(verdict, next_steps=fit(verdict.next_steps, self.step_facts(verdict, tree_alive)))
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
            phases=self._phases(end),
            processes=tuple(sorted(self.recorder.processes.values(), key=lambda p: p.first_seen)),
            probes=tuple(self.recorder.probes),
            timeline=tuple(self.recorder.timeline),
            notes=notes
            + self.assessor.notes()
            + tuple(dict.fromkeys(self.resumed))
            + (kernel_notes(self.kernels, self._label) if self.kernels is not None else ())
            + self._own_request_note()
            + self._late_note(),
            stacks=self.assessor.stack_samples(),
            stack_tree=self.assessor.stack_tree(verdict),
            kernels=self.kernels,
            flight_recorder=self.flight,
            nccl_ras=self.ras,
        )

    def _phases(self, end: float) -> tuple[PhaseSpan, ...]:
        """The phases, each boot phase with its longest quiet spell (the assessor's, to the tenth)."""
        quiet = self.assessor.longest_quiet
        return tuple(
            replace(span, quiet_s=round(quiet[span.name], 1)) if span.name in quiet else span
            for span in self.assessor.phases.spans(end)
        )

    def _late_note(self) -> tuple[str, ...]:
        """Said when the loop fell a whole interval or more behind: samples were missed (times stay true)."""
        late = self.late
        if not late:
            return ()
        return (
            f"sampling fell behind {plural(len(late), 'time')} (at most {max(late):.1f} s late: a slow "
            "/proc, NVML or stack capture); the windows count real time, not samples",
        )

    def _own_request_note(self) -> tuple[str, ...]:
        own = self.c.own
        if own is None or not own.sent:
            return ()
        last = own.latest()
        detail = f"; the last: {last.detail or 'pending'}" if last is not None else ""
        return (f"hangwatch sent {own.sent} one-token completion(s) of its own to {own.url}{detail}",)


def _frames(sample: StackSample) -> list[Frame]:
    return [f for p in sample.processes for t in p.threads for f in t.frames]


def state_and_cause(v: Verdict) -> str:
    """``stalled (wait-cycle)``: the state and cause in two words, for a line that precedes the block."""
    return v.state.value + (f" ({v.cause.value})" if v.cause else "")


def same_reading(a: Verdict, b: Verdict | None) -> bool:
    """The same state, cause and culprits: a verdict recomputed each tick of one stall is not news."""
    return b is not None and (a.state, a.cause, a.culprits) == (b.state, b.cause, b.culprits)


def build_watch(
    plan: Plan,
    options: WatchOptions,
    *,
    sampler: TreeSampler,
    log: PipeLog | FileLog | None,
    gpu: NvmlGpuSource,
    oom: OomWitness | None,
    root_pids: set[int],
    view: View,
    clock: WatchClock,
    watch_serving: bool,
) -> tuple[Watch, StackKit]:
    """The collectors, the analysis and the loop, wired the same way for ``run`` and ``attach``.

    ``watch_serving``: after ready, read the engine's /metrics; the server's client connections are
    read whenever it serves (read-only, like everything here but our own request, which is sent only
    when ``options.own_request`` allows it).
    """
    prober = make_prober(plan, options, clock)
    serving = make_serving_poller(plan, clock) if watch_serving else None
    own = make_own_requester(plan, options, clock) if options.own_request else None

    kit = stack_kit(options.stacks, gpu.unavailable is None)
    collectors = Collectors(
        sampler, log, prober, gpu, oom, kit.dumper, kit.gpm, serving, ConnectionWatcher(), own,
        gpm_ticks=GpmSource() if gpu.unavailable is None else None,
    )  # fmt: skip
    assessor = make_assessor(plan, options, root_pids, kit.history, make_scanner(plan, options))
    watch = Watch(
        collectors,
        assessor,
        view,
        clock,
        interval_s=options.interval,
    )
    watch.roots = set(root_pids)
    watch.usual = {h.phase: h for h in options.phase_usual}
    watch.kernel_names = options.kernel_names
    return watch, kit
