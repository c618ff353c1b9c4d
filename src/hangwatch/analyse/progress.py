"""The progress model: is anything in the tree moving?

The tree progresses while any process shows progress: log output that is not a "still waiting"
line, I/O, GPU memory changing, a new listening port, a probe outcome changing, a new process,
CPU time. CPU time is the weakest: a host thread waiting in cudaStreamSynchronize or a collective
spins at 100 % of a core while nothing moves, so a ``spin`` predicate (fed by the stacks) can
veto it; and small increments (a background thread's 1 s in 90 s) are noise.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from hangwatch.analyse.gpustate import MEM_UTIL_WORK
from hangwatch.analyse.gpustate import PIPE_WORK
from hangwatch.model.samples import ProbeResult
from hangwatch.model.samples import Tick
from hangwatch.words import human_bytes

# Thresholds, as rates so that they do not depend on the sampling interval.
CPU_CORES_MIN = 0.10  # 10 % of a core; a waiting vLLM worker's background thread used ~1 %
IO_BYTES_PER_S_MIN = 16 * 1024  # well above still-waiting log lines (~250 B/min) and probe traffic
GPU_MEM_DELTA_MIN = 16 * 1024 * 1024  # allocator noise is smaller; real loads move GiB
# Resident memory growing: an allocation being filled (torch.zeros of a KV cache, weights read into
# memory) is work even inside one native call whose stack never moves. Allocator noise is smaller.
RSS_DELTA_MIN = 16 * 1024 * 1024


@dataclass(frozen=True)
class Thresholds:
    cpu_cores: float = CPU_CORES_MIN
    io_bytes_per_s: float = IO_BYTES_PER_S_MIN
    gpu_mem_bytes: int = GPU_MEM_DELTA_MIN
    rss_bytes: int = RSS_DELTA_MIN


class SignalKind(StrEnum):
    """What moved: the kinds of progress signal."""

    LOG = "log"
    IO = "io"
    CPU = "cpu"
    STACK = "stack"
    MEMORY = "memory"
    GPU_MEMORY = "gpu-memory"
    GPU_WORK = "gpu-work"  # a GPU the tree computes on moves memory (NVML's memory-bandwidth utilisation)
    PORT = "port"
    PROBE = "probe"
    PROCESS = "process"
    SERVING = "serving"
    HEARTBEAT = "heartbeat"  # a line said again with other counts (logscan: LogScanner._heartbeat)


@dataclass(frozen=True)
class ProgressSignal:
    """One reason the tree counts as progressing at one tick."""

    kind: SignalKind
    pid: int | None
    text: str


def progress_signals(
    prev: Tick | None,
    tick: Tick,
    last_probe: ProbeResult | None,
    thresholds: Thresholds = Thresholds(),
    spinning: Callable[[int], bool] = lambda pid: False,
    *,
    serving: bool = False,
    paused: Callable[[ProbeResult], bool] = lambda probe: False,
) -> tuple[ProgressSignal, ...]:
    """Everything at ``tick`` that counts as progress since ``prev``.

    ``serving``: the server was ready. A probe that then turns from green to failing, or flaps between
    failures (SGLang's /health answers 503 after 20 s while its scheduler is wedged, and the next probe
    times out), is evidence of a wedge (serving.py), not progress; only turning green again is.

    ``paused``: the probe ran while a stack capture of hangwatch's had the tree's processes paused.
    Turning from such a probe's failure back to green is hangwatch's own doing, not progress: a native
    dump of a loaded TP=2 tree paused vLLM's API server for 5 s, the /health probe timed out, the next
    answered, and that "recovery" put the wedge's verdict 10 s late (vllm-tp2-TP1-serving-spin-run,
    2026-12-04, tenth session).
    """
    if prev is None:
        return (ProgressSignal(SignalKind.PROCESS, None, "supervision started"),)
    dt = max(tick.t - prev.t, 1e-3)
    signals: list[ProgressSignal] = []
    if tick.log.progress_lines > 0:
        signals.append(ProgressSignal(SignalKind.LOG, None, f"{tick.log.progress_lines} new log lines"))
    before = {p.pid: p for p in prev.processes}
    ours = our_traffic(prev, tick)
    for p in tick.processes:
        old = before.get(p.pid)
        if old is None:
            signals.append(ProgressSignal(SignalKind.PROCESS, p.pid, f"new process {p.pid} ({p.name})"))
            continue
        # What the server read and wrote answering hangwatch itself (its /metrics, our probe) is not work.
        io = p.io_delta_bytes - sum(ours.get(port, 0) for port in p.listening_ports)
        if io / dt >= thresholds.io_bytes_per_s:
            signals.append(
                ProgressSignal(
                    SignalKind.IO, p.pid, f"{p.name} [{p.pid}] I/O {human_bytes(p.io_delta_bytes)}"
                )
            )
        grown = p.rss_bytes - old.rss_bytes
        if grown >= thresholds.rss_bytes:
            signals.append(
                ProgressSignal(SignalKind.MEMORY, p.pid, f"{p.name} [{p.pid}] memory +{human_bytes(grown)}")
            )
        if p.cpu_delta_s / dt >= thresholds.cpu_cores and not spinning(p.pid):
            signals.append(
                ProgressSignal(SignalKind.CPU, p.pid, f"{p.name} [{p.pid}] CPU {p.cpu_delta_s / dt:.0%}")
            )
        new_ports = set(p.listening_ports) - set(old.listening_ports)
        if new_ports:
            ports = ", ".join(map(str, sorted(new_ports)))
            signals.append(ProgressSignal(SignalKind.PORT, p.pid, f"{p.name} [{p.pid}] listens on {ports}"))
    signals.extend(_gpu_memory_signals(prev, tick, thresholds))
    signals.extend(gpu_work_signals(tick))
    signals.extend(_serving_signals(prev, tick))
    if tick.probes:
        first = last_probe
        for probe in tick.probes:
            green = probe.green
            if first is not None and probe.key != first.key and (green or not serving) and not paused(first):
                signals.append(
                    ProgressSignal(SignalKind.PROBE, None, f"probe {first.describe()} -> {probe.describe()}")
                )
            first = probe
    return tuple(signals)


def gpu_work_signals(tick: Tick) -> list[ProgressSignal]:
    """A GPU of the tree's doing real work, whatever its host does (polls an event between short sleeps,
    sits in a blocked launch, waits in a synchronize): progress of its own, as solid as GPU memory moving.

    Work is memory moved: NVML's memory-bandwidth utilisation at ``MEM_UTIL_WORK`` or more (a spinning
    kernel reads 0 %, a GEMM 23-47 %, a copy 100 %: docs/gpu-signals.md); or, on a GPU with GPM, an
    arithmetic pipe (tensor, FP32, FP16, integer) at ``PIPE_WORK`` or more since the previous tick:
    compute whose operands stay in cache moves little memory (small GEMMs read 6 %), while every SM
    spinning lifts the integer pipe to 0.65 % and nothing else. The GPU is the tree's when a process of
    the tree holds memory on it and, where NVML gives per-process samples, one of the tree's
    kernels ran on its SMs; without those samples, only when no process outside the tree holds memory
    there (another tenant's work is not ours). 2026-12-04: 80 s of tensor-core GEMMs on a side stream,
    the host polling the completion event with short sleeps, was "stalled / unknown" at a 20 s window:
    only GPU memory moving counted then.
    """
    if tick.gpu is None or tick.gpu.unavailable or not tick.gpu.gpus:
        return []
    members = {p.pid for p in tick.processes}
    pipes = {a.index: a for a in tick.gpu.activity}
    signals = []
    for g in tick.gpu.gpus:
        activity = pipes.get(g.index)
        if g.mem_util_pct is not None and g.mem_util_pct >= MEM_UTIL_WORK:
            why = f"memory {g.mem_util_pct:.0f} % busy"
        elif activity is not None and activity.computing(PIPE_WORK):
            why = f"pipes {activity.describe()}"
        else:
            continue
        held = [p for p in tick.gpu.processes if p.gpu_index == g.index]
        ours = [p for p in held if p.pid in members]
        if not ours:
            continue
        sampled = [p for p in held if p.sm_util_pct is not None]
        if sampled:
            running = [p for p in ours if p.sm_util_pct]
            if not running:
                continue
            pid: int | None = running[0].pid
        elif len(ours) < len(held):
            continue
        else:
            pid = ours[0].pid if len(ours) == 1 else None
        signals.append(ProgressSignal(SignalKind.GPU_WORK, pid, f"GPU {g.index} working ({why})"))
    return signals


def _gpu_memory_signals(prev: Tick, tick: Tick, thresholds: Thresholds) -> list[ProgressSignal]:
    if tick.gpu is None or prev.gpu is None or tick.gpu.unavailable:
        return []
    signals = []
    old = {g.index: g.mem_used_bytes for g in prev.gpu.gpus}
    for g in tick.gpu.gpus:
        before = old.get(g.index)
        if g.mem_used_bytes is None or before is None:
            continue
        delta = g.mem_used_bytes - before
        if abs(delta) >= thresholds.gpu_mem_bytes:
            sign = "+" if delta > 0 else "-"
            signals.append(
                ProgressSignal(
                    SignalKind.GPU_MEMORY, None, f"GPU {g.index} memory {sign}{human_bytes(abs(delta))}"
                )
            )
    return signals


def our_traffic(prev: Tick, tick: Tick) -> dict[int, int]:
    """Bytes exchanged since ``prev`` on hangwatch's own connections to the server, per server port."""
    if tick.connections is None:
        return {}
    old = {}
    if prev.connections is not None:
        old = {(c.port, c.peer_port): c for c in prev.connections.connections if c.ours}
    traffic: dict[int, int] = {}
    for c in tick.connections.connections:
        if not c.ours:
            continue
        was = old.get((c.port, c.peer_port))
        moved = (c.acked_bytes or 0) + (c.received_bytes or 0)
        if was is not None:
            moved -= (was.acked_bytes or 0) + (was.received_bytes or 0)
        traffic[c.port] = traffic.get(c.port, 0) + max(0, moved)
    return traffic


# Data flowing through a process in every tick of a span shows its code moving, however the stacks
# caught it: a span of two intervals at least (one could hold a single background write), at a rate
# above a heartbeat's. SGLang's schedulers idling with --sleep-on-idle wake once a second and move
# 50-100 bytes (measured, 2026-12-02); the smallest working loop measured, four gloo ranks doing an
# all_reduce of 16 floats every 0.25-1 s, writes 640 bytes a step per rank.
FLOW_TICKS = 2
FLOW_BYTES_PER_S_MIN = 256
# Fresh memory touched is data moving too: page faults at this rate (1 MiB/s of 4 KiB pages). A spin
# re-reading a flag faults nothing; CPU work that allocates or copies faults all the time (2026-12-04,
# tests/programs/work_loops.py on the 2-core machine: a loop of a recursion, a sort and a dict build
# 38,000 faults/s, hashing a 4 MiB buffer 88,000/s, JSON 64,000/s, regular expressions 1,000/s; a
# spinning Python loop 0).
FLOW_FAULTS_PER_S_MIN = 256


def data_moved(prev: Tick, tick: Tick, min_rate: float = FLOW_BYTES_PER_S_MIN) -> frozenset[int]:
    """The processes that read or wrote ``min_rate`` bytes a second or more between two ticks, hangwatch's
    own traffic with the server left out, or that faulted in fresh memory at ``FLOW_FAULTS_PER_S_MIN``.

    Below the I/O threshold this is not progress of its own (a log line is bytes too); it is what
    ``data_flowing`` is made of. Counts what /proc/PID/io counts: write() and read() of sockets and
    pipes (gloo's sends are writes), not send()/recv() (gloo's receives, ZeroMQ's traffic); and the
    page faults /proc/PID/stat counts, the one trace CPU work that touches memory leaves when it does
    no I/O (a weight-layout pass, a tokenizer's table build): its code moves whatever three stack
    captures caught, as a transfer's does.
    """
    dt = max(tick.t - prev.t, 1e-3)
    ours = our_traffic(prev, tick)
    before = {p.pid: p.faults for p in prev.processes}
    return frozenset(
        p.pid
        for p in tick.processes
        if p.pid in before
        and (
            (p.io_delta_bytes - sum(ours.get(port, 0) for port in p.listening_ports)) / dt >= min_rate
            or _faulted(before[p.pid], p.faults) / dt >= FLOW_FAULTS_PER_S_MIN
        )
    )


def _faulted(before: int | None, after: int | None) -> int:
    return after - before if before is not None and after is not None and after > before else 0


def data_flowing(ticks: Sequence[Tick], start: float, end: float) -> frozenset[int]:
    """The processes that moved data in every tick interval between ``start`` and ``end``.

    A loop of small steps (a little compute, a collective, a short sleep) can be caught by three stack
    captures in the same few lines, so on stacks alone it reads like a poll loop; and on a loaded
    machine its CPU share can fall under the busy threshold. What tells it from a wait is that data
    goes in and out of it all the time: the peers it exchanges with answer. A wait for a peer that
    never arrives moves no bytes, whether it sleeps or spins (a collective's flag poll, a blocked
    recv). Sustained over every interval, because one tick's bytes can be a background thread's
    single write (a log line, a heartbeat).
    """
    inside = [i for i in range(1, len(ticks)) if start < ticks[i].t <= end]
    if len(inside) < FLOW_TICKS:
        return frozenset()
    return _in_every(data_moved(ticks[i - 1], ticks[i]) for i in inside)


def flowing_over(
    intervals: Iterable[tuple[float, frozenset[int]]], start: float, end: float
) -> frozenset[int]:
    """``data_flowing`` from each interval's ``data_moved`` kept beside its end time (StackHistory
    computes it once per tick, not once per tick of the span on every tick)."""
    inside = [moved for t, moved in intervals if start < t <= end]
    if len(inside) < FLOW_TICKS:
        return frozenset()
    return _in_every(iter(inside))


def _in_every(sets: Iterator[frozenset[int]]) -> frozenset[int]:
    flowing = next(sets, frozenset())
    for moved in sets:
        if not flowing:
            break
        flowing &= moved
    return flowing


def _serving_signals(prev: Tick, tick: Tick) -> list[ProgressSignal]:
    """The server sent its clients data (answers, streamed tokens), or answered our own request."""
    signals = []
    if tick.connections is not None and prev.connections is not None:
        before = {(c.port, c.peer_port): c.acked_bytes for c in prev.connections.theirs}
        sent = 0
        for c in tick.connections.theirs:
            old = before.get((c.port, c.peer_port))
            if c.acked_bytes is not None and old is not None and c.acked_bytes > old:
                sent += c.acked_bytes - old
        if sent:
            signals.append(
                ProgressSignal(SignalKind.SERVING, None, f"the server sent its clients {human_bytes(sent)}")
            )
    own, old_own = tick.own_request, prev.own_request
    fresh = (
        old_own is None or old_own.sent_t != own.sent_t or old_own.done_t is None
        if own is not None
        else False
    )
    if own is not None and own.answered and own.done_t is not None and fresh:
        signals.append(
            ProgressSignal(SignalKind.SERVING, None, f"hangwatch's own request answered: {own.detail}")
        )
    return signals


# CPU time and a moved stack are weak evidence: a spin burns CPU too, so the stacks can discount them.
# So is a line said again with other counts: a wait that logs says it too (``attempt 7``).
WEAK_KINDS = frozenset({SignalKind.CPU, SignalKind.STACK, SignalKind.HEARTBEAT})


class ProgressClock:
    """When did the tree last progress, and why: the latest time of each kind of signal per process.

    Kept per (kind, pid) so that evidence can be discounted after the fact: once the stacks show that
    a process has been spinning in place since time S, its CPU after S was never progress
    (``last_progress(discount={pid: S})``), and the stall window counts from the last real progress,
    not from the moment the spin was recognised.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._start = start
        self._last: dict[tuple[SignalKind, int | None], float] = {}
        self.last_signals: tuple[ProgressSignal, ...] = ()

    def observe(self, t: float, signals: tuple[ProgressSignal, ...]) -> None:
        for s in signals:
            self._last[(s.kind, s.pid)] = t
        if signals:
            self.last_signals = signals

    def last_progress(
        self,
        discount: Mapping[int, float] | None = None,
        *,
        weak: bool = True,
        parked: Mapping[int, float] | None = None,
    ) -> float:
        """The latest progress; weak evidence of a pid in ``discount`` counts only up to its time there.

        ``weak=False``: progress other than CPU time, moved stacks and heartbeats only. ``parked``: pids
        whose code has stayed in place since then, whatever their CPU: the lines they say again with
        other counts are a wait that logs (CPU is discounted only for a spin: ``discount``).
        """
        latest = self._start
        for (kind, pid), seen in self._last.items():
            counted = seen
            if kind in WEAK_KINDS:
                if not weak:
                    continue
                since = discount if kind is not SignalKind.HEARTBEAT else parked
                if since is not None and pid is not None and pid in since:
                    counted = min(seen, since[pid])
            latest = max(latest, counted)
        return latest

    def last_of(self, kind: SignalKind) -> float:
        """The latest signal of one kind ("process": a new process appeared), or the start."""
        return max((t for (k, _), t in self._last.items() if k == kind), default=self._start)

    @property
    def last_progress_t(self) -> float:
        return self.last_progress()

    def quiet_for(self, now: float, discount: Mapping[int, float] | None = None) -> float:
        return max(0.0, now - self.last_progress(discount))
