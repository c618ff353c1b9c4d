"""When to take stacks during supervision, and what the samples of the current quiet spell say.

No stacks are taken while the tree visibly progresses (log lines, I/O, ports, probes, new processes):
a healthy boot costs nothing. Once nothing but CPU time has moved for ``quiet_before_s``, a burst of
``samples`` captures ``gap_s`` apart starts; while only CPU keeps moving (a silent compile) the
captures slow to one every ``relaxed_gap_s``; when everything goes quiet a new burst starts, so a
tree that stops after a long compile is judged on fresh samples.

Defaults (3 s, 3 samples, 2 s apart): three samples spanning 4 s are enough to tell a stack that
stays put from one that moves (two could agree by chance in a loop), they fit inside the 15 s
budget for a closed wait with room for a slow native dump, and a Python-only py-spy dump pauses a
target for milliseconds, so the cost is nil. The first two captures of a burst ask for native
frames (0.1-1.4 s of py-spy's CPU per torch process, mostly symbol loading): two, because whether a
long native call moves (a GEMM) or spins in place (a C poll loop) shows only by comparing native
frames (stackmotion.py). Later ones are Python-only and borrow the native frames of an earlier
capture whose Python stack is identical.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace

from hangwatch.analyse.causes import Diagnosis
from hangwatch.analyse.gpustate import gpu_state
from hangwatch.analyse.gpustate import gpus_of
from hangwatch.analyse.progress import data_moved
from hangwatch.analyse.progress import flowing_over
from hangwatch.analyse.stackcontext import stack_context
from hangwatch.analyse.stackframes import signature
from hangwatch.analyse.stackmotion import apart_at_the_leaf
from hangwatch.analyse.stackmotion import in_place
from hangwatch.analyse.stackmotion import walks_helpers
from hangwatch.analyse.stackrules import classify
from hangwatch.analyse.stackwaits import ProcessView
from hangwatch.analyse.stackwaits import Wait
from hangwatch.analyse.stackwaits import classify_thread
from hangwatch.analyse.stackwaits import process_views
from hangwatch.analyse.stackwaits import thread_histories
from hangwatch.analyse.stackwaits import thread_in_place
from hangwatch.analyse.waitgraph import WaitGraph
from hangwatch.analyse.waitgraph import wait_graph
from hangwatch.model.samples import STOPPED_STATES
from hangwatch.model.samples import ExitRecord
from hangwatch.model.samples import GpuActivity
from hangwatch.model.samples import GpuSample
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import ProcessStacks
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import ThreadStack
from hangwatch.model.stacks import intern_frames
from hangwatch.model.stacks import replaced

QUIET_BEFORE_S = 3.0
SAMPLES = 3
GAP_S = 2.0
RELAXED_GAP_S = 10.0
MIN_SPAN_S = 3.5  # a closed verdict needs samples spanning at least this (3 samples, 2 s apart, minus jitter)
# A busy process its frames do not name a wait for is a spin only when this many captures, 1 s apart once
# the burst found it in place, all find it in place: three captures of a loop of helpers (a sort, a dict
# build) can all land in the same helper (2026-12-04: a rank of torch.multiprocessing.spawn, three of
# three in its dict build, stalled as a spin at an 8 s window); a spin-wait re-reads one condition, and
# six captures of it agree as three do.
SPIN_SAMPLES = 6
CONFIRM_GAP_S = 1.0
KEEP = 12  # samples kept for the report
TICKS_KEPT = 64  # ticks kept for data flow: more than the span of a relaxed spell's samples
_WORK = frozenset({Wait.RUNNING, Wait.COMPILE, Wait.CAPTURE, Wait.IO, Wait.OTHER})


@dataclass(frozen=True)
class StackPolicy:
    quiet_before_s: float = QUIET_BEFORE_S
    samples: int = SAMPLES
    gap_s: float = GAP_S
    relaxed_gap_s: float = RELAXED_GAP_S
    min_span_s: float = MIN_SPAN_S
    spin_samples: int = SPIN_SAMPLES
    confirm_gap_s: float = CONFIRM_GAP_S


class StackHistory:
    """The samples taken so far, the current spell's, and the judgements the assessor asks for.

    Two windows of samples: the *spell* (since everything went quiet, or since only CPU moves) is what
    a verdict is judged on; the *solid* window (since anything but CPU last moved) is what the spin
    veto is judged on, so that a new burst starting does not briefly lift the veto it caused.
    """

    def __init__(self, policy: StackPolicy = StackPolicy()) -> None:
        self.policy = policy
        self.kept: list[StackSample] = []
        self._spell: list[StackSample] = []
        self._solid: list[StackSample] = []
        self._dense: list[StackSample] = []  # the latest captures, for a spin its frames do not name
        self._confirmed_pids: frozenset[int] | None = None  # judged on ``_dense``, once per capture
        self._anchor: float | None = None
        self._spin_views: tuple[ProcessView, ...] | None = None
        self._spin_graph: WaitGraph | None = None  # the kernel's wait-for graph over the same samples
        self._gpu: GpuSample | None = None
        self._moved_seen: StackSample | None = None
        self._solid_since = 0.0
        # pid -> the latest capture that found its code moved (not only at the leaf: see spin_since)
        self._moved_at: dict[int, float] = {}
        # What moved data in each of the latest tick intervals (end time, pids), for the data that
        # flows through each process over the samples' span; computed once per tick.
        self._last_tick: Tick | None = None
        self._moved_by_tick: deque[tuple[float, frozenset[int]]] = deque(maxlen=TICKS_KEPT)
        self._flowing: frozenset[int] = frozenset()  # what the cached spin views were judged with

    @property
    def spell(self) -> list[StackSample]:
        return list(self._spell)

    def due(self, now: float, solid_since: float, quiet_since: float) -> bool:
        """Time for a capture? ``solid_since``: last progress other than CPU; ``quiet_since``: last of any."""
        p = self.policy
        if now - solid_since < p.quiet_before_s:
            self.restart()
            return False
        self._solid_since = solid_since
        anchor = quiet_since if now - quiet_since >= p.quiet_before_s else solid_since
        if anchor != self._anchor:
            self._anchor = anchor
            # The captures since the new anchor are this spell's: a spin found late re-dates the quiet
            # spell to when the spin began, and what was captured meanwhile is its evidence. Emptied,
            # the spell held one capture when the verdict came at once (its window already over), and no
            # rule can judge one capture (vllm-tp2-TP1-compile-raise-run, 2026-12-04: "no rule matched",
            # the culprit lost).
            self._spell = [s for s in self.kept if s.t >= anchor][-p.samples :]
        if not self._spell:
            return True
        if len(self._spell) < p.samples:
            gap = p.gap_s
        elif self._confirming():
            gap = p.confirm_gap_s
        else:
            gap = p.relaxed_gap_s
        return now - self._spell[-1].t >= gap

    def _confirming(self) -> bool:
        """A busy process found in place that is not yet a spin: more Python-only captures (milliseconds
        of pause each), until ``spin_samples`` of them say whether its code moves."""
        if len(self._dense) >= self.policy.spin_samples or len(self._solid) < self.policy.samples:
            return False
        return any(v.spinning and not v.burns_in_a_wait for v in self._views())

    def _confirmed(self, pid: int) -> bool:
        """Every one of ``spin_samples`` captures found its busy threads' Python code in place, one
        helper at most below the loop (stackmotion): a spin-wait, not a loop of work caught three times
        in the same helper. Judged once per new capture, for every process at once."""
        if len(self._dense) < self.policy.spin_samples:
            return False
        if self._confirmed_pids is None:
            busy: dict[int, list[list[ThreadStack]]] = {}
            for (p, _), (every, _native) in thread_histories(self._dense).items():
                if any(t.active for t in every):
                    busy.setdefault(p, []).append(every)
            self._confirmed_pids = frozenset(
                p for p, threads in busy.items() if all(in_place(t) and not walks_helpers(t) for t in threads)
            )
        return pid in self._confirmed_pids

    def restart(self) -> None:
        """Forget the spell: the next capture begins a new one (its judgements never span the gap)."""
        self._anchor = None
        self._spell = []
        self._solid = []
        self._dense = []
        self._confirmed_pids = None
        self._spin_views = None
        self._moved_at = {}
        self._moved_by_tick.clear()

    def wants_native(self) -> bool:
        """Native frames for the first two captures of a burst only (they cost symbol loading every time)."""
        return len(self._spell) < 2

    def add(self, sample: StackSample) -> None:
        if self._solid:
            self._note_moves(self._solid[-1], sample)
        self._spell = [*self._spell, sample][-self.policy.samples :]
        self._solid = [*self._solid, sample][-self.policy.samples :]
        self._dense = [*self._dense, sample][-self.policy.spin_samples :]
        self.kept = [*self.kept, sample][-KEEP:]
        self._spin_views = None
        self._confirmed_pids = None

    def observe_tick(self, tick: Tick) -> None:
        if tick.gpu is not None:
            self._gpu = tick.gpu
        # Intervals before the spell's first sample are never inside its span: a healthy boot pays nothing.
        if self._last_tick is not None and self._solid:
            self._moved_by_tick.append((tick.t, data_moved(self._last_tick, tick)))
        self._last_tick = tick
        # Only an interval ending inside the samples' span can change what flowed through it.
        inside = bool(self._solid) and tick.t <= self._solid[-1].t
        if self._spin_views is not None and inside and self._solid_flowing() != self._flowing:
            self._spin_views = None

    def _solid_flowing(self) -> frozenset[int]:
        if len(self._solid) < 2:
            return frozenset()
        return flowing_over(self._moved_by_tick, self._solid[0].t, self._solid[-1].t)

    def samples_for_analysis(self) -> list[StackSample]:
        """The spell's samples, the latest one enriched with native frames of an earlier identical stack.

        The donors may be older than the spell: after its burst a long quiet spell is sampled by
        Python-only captures, and what a thread parked in one place waits in natively (a read of a
        pipe, a futex) is still what the last native dump of that same Python stack showed.
        """
        if not self._spell:
            return []
        donors = [s for s in self.kept if s.t < self._spell[-1].t]
        return [*self._spell[:-1], with_native_detail([*donors, self._spell[-1]])]

    def moved(self) -> tuple[int, ...]:
        """Pids with a thread on CPU, outside any wait, whose stack changed since the previous capture.

        Reported once per new capture. The progress model counts them like CPU time: a burner starved
        under 10 % of a core by a loaded machine still shows it is executing code.
        """
        if len(self._solid) < 2 or self._moved_seen is self._solid[-1]:
            return ()
        self._moved_seen = self._solid[-1]
        before = {(p.pid, t.tid): signature(t) for p in self._solid[-2].dumped for t in p.threads}
        out = []
        for p in self._solid[-1].dumped:
            for t in p.threads:
                old = before.get((p.pid, t.tid))
                if t.active and old is not None and old != signature(t) and classify_thread(t)[0] in _WORK:
                    out.append(p.pid)
                    break
        return tuple(out)

    def _note_moves(self, before: StackSample, after: StackSample) -> None:
        histories = thread_histories([before, after])
        for (pid, _), history in histories.items():
            every = history[0]
            if (
                len(every) == 2
                and any(t.active for t in every)
                and not thread_in_place(history)
                and not apart_at_the_leaf(every, history[1])
            ):
                self._moved_at[pid] = after.t

    def parked(self, pid: int) -> bool:
        """Every thread of it stayed in place over the burst's samples, busy or not (its heartbeat lines
        are then a wait that logs), and it is not a host waiting for its GPU's work (a training loop in
        ``torch.cuda.synchronize`` that prints ``step N``)."""
        view = self._solid_view(pid)
        return view is not None and view.unchanged and not self._waits_for_working_gpu(pid, view)

    def _solid_view(self, pid: int) -> ProcessView | None:
        if len(self._solid) < self.policy.samples:
            return None
        return next((v for v in self._views() if v.pid == pid), None)

    def _views(self) -> tuple[ProcessView, ...]:
        """The views of the solid window's samples and the kernel's wait-for graph over them, computed
        once per new capture or change of what flowed."""
        if self._spin_views is None:
            self._flowing = self._solid_flowing()
            enriched = _enriched(self._solid)
            self._spin_views = process_views(enriched, self._flowing)
            parents = (
                {p.pid: p.ppid for p in self._last_tick.processes} if self._last_tick is not None else {}
            )
            self._spin_graph = wait_graph(enriched, parents)
        return self._spin_views

    def spinning(self, pid: int, *, awaited: bool = False) -> bool:
        """CPU rising while the code stays in place, and the tree shows it part of a wait: the progress
        model's veto.

        Over the burst's three samples, not two: two captures of a busy recursive workload can find it
        at the same depth and line by chance; three rarely do. In place is not enough: a tight loop that
        calls nothing the stacks can resolve and touches no fresh memory (a sort inside C, a pure-Python
        arithmetic loop) is caught in place too, and only the tree tells a spin-wait from it: a wait is
        for someone (``held_up``). ``awaited``: requests wait for the tree's answer (the assessor knows).
        """
        view = self._solid_view(pid)
        return (
            view is not None
            and view.spinning
            and (view.burns_in_a_wait or self._confirmed(pid))
            and not self._waits_for_working_gpu(pid, view)
            and (awaited or self.held_up(view))
        )

    def held_up(self, view: ProcessView) -> bool:
        """The tree shows this in-place burner part of a wait. Its frames name one (a collective, a
        synchronize, a poll: ``SPIN_WAITS``); another member waits for it in the kernel (a read of what
        it writes, a lock it holds; a parent joining it does not count); a member is stuck in a wait of
        its own (blocked untimed in the kernel, not reading for a message, not joining children) or
        stopped, which a spin can be waiting for; or it is a rank and another rank of its group is
        blocked. Otherwise nobody waits on it and it waits on nobody the tree shows: its CPU is work
        (2026-12-04: a lone process sorting in C, or in a pure-Python arithmetic loop, was "busy in the
        same place: a spin" and stalled at its window)."""
        if view.burns_in_a_wait:
            return True
        others = [v for v in self._views() if v.pid != view.pid]
        graph = self._spin_graph
        if graph is not None:
            apart = graph.joiners | {view.pid}
            if any(view.pid in wakers for pid, wakers in graph.waits_for if pid not in apart):
                return True
            if graph.stuck - apart - graph.receivers:
                return True
        if any(v.outcome is DumpOutcome.STOPPED or v.state in STOPPED_STATES for v in others):
            return True
        if self._waits_for_spinning_gpu(view.pid):
            return True
        return view.peer and any(v.peer and v.blocked for v in others)

    def _waits_for_spinning_gpu(self, pid: int) -> bool:
        """Its GPU is busy doing nothing, as GPM's pipes measure it: the host burning in place polls a
        kernel that waits (a flag only another process can set), whatever its frames are called, and
        with no rank to say so (a producer and a consumer sharing GPU memory through CUDA IPC: the poller
        counted as progress for 240 s on an H100, 2026-12-06). Only from GPM's pipes: NVML's utilisation
        alone reads an FMA chain in registers as a spin, and that host's CPU must stay progress."""
        own = gpus_of(self._gpu, pid)
        if own is None:
            return False
        measured = [a for a in self._gpm_readings() if a.index in own]
        return bool(measured) and gpu_state(None, measured, own) == "spinning"

    def _gpm_readings(self) -> tuple[GpuActivity, ...]:
        """GPM's pipes: the latest capture's, else the loop's own reading of this tick."""
        if self._solid and self._solid[-1].gpus:
            return self._solid[-1].gpus
        return self._gpu.activity if self._gpu is not None else ()

    def _waits_for_working_gpu(self, pid: int, view: ProcessView) -> bool:
        """A host thread parked in place while the GPU works hard is waiting for real work (a long
        kernel), whether it waits in a CUDA synchronize or in a library's own wrapper."""
        if gpu_state(self._gpu, self._solid[-1].gpus, gpus_of(self._gpu, pid)) != "working":
            return False
        syncing = any(t.wait is Wait.CUDA_SYNC for t in view.threads)
        on_gpu = self._gpu is not None and any(g.pid == pid for g in self._gpu.processes)
        return syncing or on_gpu

    def spin_since(self, pid: int) -> float:
        """Since when a spinning process has been in place: its CPU after this was not progress.

        The latest capture that found its code moving, else the start of the quiet spell (the last
        progress other than CPU): the samples begin ``quiet_before_s`` after it and find the code
        already in place.

        Asked only of a process the solid window's captures hold in place (spinning, or parked). A move
        that two captures saw only at the leaf of a native call does not date it: two captures of a
        poll loop can find it in its two calls, and the loop is what the later captures hold in place.
        vLLM's CPU all-reduce, caught in ``get_curr_stamp`` then ``get_ready_stamp``, had its spin dated
        from the second capture, and the stall came 6.6 s late (vllm-tp2-TP1-serving-block-run,
        2026-12-04, tenth session: 37.4 s for a bound of 35).
        """
        return max(self._solid_since, self._moved_at.get(pid, self._solid_since))

    def diagnose(
        self,
        window: Sequence[Tick],
        laggards: tuple[int, ...] = (),
        *,
        before_ready: bool = False,
        departed: tuple[ExitRecord, ...] = (),
    ) -> Diagnosis | None:
        """The stack rules over the spell's samples (None when no stack was taken in this spell).

        ``laggards``: ranks whose own log lines stopped at an earlier phase than their peers';
        ``before_ready``: a server that was never ready yet (no input is due to it).
        """
        samples = self.samples_for_analysis()
        if not samples or not any(p.threads for p in samples[-1].processes):
            return None
        exits = tuple(e for t in window for e in t.exits)
        context = replace(stack_context(samples, window, exits), laggards=laggards, before_ready=before_ready)
        if departed:
            # Ranks that left cleanly, however long ago: the others may wait for them still.
            context = replace(
                context, exits=(*context.exits, *(e for e in departed if e not in context.exits))
            )
        return classify(context)

    def closed_wait(self, window: Sequence[Tick], departed: tuple[ExitRecord, ...] = ()) -> Diagnosis | None:
        """A diagnosis the assessor may act on early: closed, over enough samples and time."""
        p = self.policy
        if len(self._spell) < p.samples or self._spell[-1].t - self._spell[0].t < p.min_span_s:
            return None
        found = self.diagnose(window, departed=departed)
        return found if found is not None and found.closed else None


def _enriched(samples: Sequence[StackSample]) -> list[StackSample]:
    return [*samples[:-1], with_native_detail(samples)] if samples else []


def with_native_detail(samples: Sequence[StackSample]) -> StackSample:
    """The latest sample, where each Python-only thread borrows the native frames of the most recent
    earlier dump of the same thread whose Python stack (lines included) is identical."""
    latest = samples[-1]
    detail = NativeDetail(samples[:-1])
    if not detail:
        return latest
    processes: list[ProcessStacks] = []
    for p in latest.processes:
        if p.native or not p.threads:
            processes.append(p)
            continue
        threads = []
        for t in p.threads:
            frames = detail.frames(p.pid, t)
            threads.append(t if frames is None else replaced(t, frames=frames))
        processes.append(replaced(p, threads=tuple(threads)))
    return replaced(latest, processes=tuple(processes))


# (id of a donor's frames, id of a thread's frames) -> (the donor's frames, the thread's, what it borrows).
Borrowed = dict[tuple[int, int], tuple[tuple[Frame, ...], tuple[Frame, ...], tuple[Frame, ...] | None]]


class NativeDetail:
    """The native frames a Python-only capture's threads borrow from earlier native dumps of the same
    threads (``with_native_detail``; the merge across nodes gives them as it copies each rank)."""

    def __init__(self, earlier: Sequence[StackSample], borrowed: Borrowed | None = None) -> None:
        self._donors: dict[tuple[int, int], ThreadStack] = {}  # the latest native capture of each thread
        for sample in earlier:
            for p in sample.dumped:
                if p.native:
                    for t in p.threads:
                        self._donors[(p.pid, t.tid)] = t
        # What a donor's frames and a thread's give, once per pair of frames tuples: 10,000 ranks in one
        # wait are a handful of pairs (0.17 s -> 0.05 s at 10,000 ranks). ``borrowed``: shared with other
        # samples' (the merge across nodes gives one to every node: their ranks share their stacks).
        self._borrowed: Borrowed = {} if borrowed is None else borrowed

    def __bool__(self) -> bool:
        return bool(self._donors)

    def frames(self, pid: int, thread: ThreadStack) -> tuple[Frame, ...] | None:
        """The frames the thread of a Python-only capture gets: its last native dump's, where its Python
        stack (lines included) is that dump's, with the newer source lines; None: its own."""
        donor = self._donors.get((pid, thread.tid))
        if donor is None:
            return None
        pair = (id(donor.frames), id(thread.frames))
        known = self._borrowed.get(pair)
        if known is not None:
            return known[2]
        same = donor.signature() == thread.signature()
        found = intern_frames(_merge_code(donor.frames, thread)) if same else None
        # Keyed by ids, holding the two tuples: neither is freed, nor its id reused, while the entry lives.
        self._borrowed[pair] = (donor.frames, thread.frames, found)
        return found


def _merge_code(frames: tuple[Frame, ...], thread: ThreadStack) -> tuple[Frame, ...]:
    """Keep the source line the newer dump read (the donor may have none)."""
    codes = {(f.name, f.file, f.line): f.code for f in thread.frames if f.code}
    if not codes:
        return frames
    return tuple(
        replace(f, code=codes.get((f.name, f.file, f.line), f.code)) if not f.native else f for f in frames
    )
