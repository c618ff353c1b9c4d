"""What the stack rules see: the views of every process from the stack samples, with the other signals
of the window (/proc states and CPU from the ticks, the GPUs, the members that ended)."""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from hangwatch.analyse.causes import ended_unseen
from hangwatch.analyse.causes import io_waiting_processes
from hangwatch.analyse.progress import data_flowing
from hangwatch.analyse.serving import OWN_REQUEST_SLOW_S
from hangwatch.analyse.stackwaits import CPU_BUSY_CORES
from hangwatch.analyse.stackwaits import ProcessView
from hangwatch.analyse.stackwaits import process_views
from hangwatch.analyse.waitgraph import WaitGraph
from hangwatch.analyse.waitgraph import wait_graph
from hangwatch.analyse.world import ExpectedWorld
from hangwatch.analyse.world import expected_world
from hangwatch.model.kernelwaits import ProcessWaits
from hangwatch.model.lockfiles import LockFile
from hangwatch.model.samples import ENDED_STATES
from hangwatch.model.samples import ExitRecord
from hangwatch.model.samples import GpuActivity
from hangwatch.model.samples import GpuSample
from hangwatch.model.samples import ProcState
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import paused_gc
from hangwatch.model.vocabulary import Confidence
from hangwatch.ranges import compact_ranges

KERNEL_TICKS = 3  # how many of the latest ticks say whose kernels are on the GPU


@dataclass(frozen=True)
class StackContext:
    views: tuple[ProcessView, ...]
    samples: int
    span_s: float  # seconds between the first and the last sample
    exits: tuple[ExitRecord, ...] = ()  # failed members of the tree seen in the window
    states: tuple[tuple[int, str], ...] = ()  # latest /proc state per pid, from the ticks
    d_state: tuple[int, ...] = ()  # pids in uninterruptible sleep most of the window
    window_cpu: tuple[tuple[int, float], ...] = ()  # cores used per pid over the window, from the ticks
    gpu: GpuSample | None = None
    gpm: tuple[GpuActivity, ...] = ()
    parents: tuple[tuple[int, int], ...] = ()  # pid -> ppid, from the ticks
    laggards: tuple[int, ...] = ()  # ranks whose own log lines stopped at an earlier phase than their peers'
    # Processes whose kernels ran on the SMs in the last few ticks (NVML's per-process samples); None
    # where NVML gives no such samples.
    kernels: frozenset[int] | None = None
    # Requests known to wait for an answer (the server's client connections, hangwatch's own request),
    # in words; and whether the connections were read at all (without them nobody knows).
    requests_waiting: tuple[str, ...] = ()
    connections_read: bool = False
    # Who waits for whom in the kernel, where every member's waits could be read (analyse/waitgraph.py).
    waits: WaitGraph | None = None
    # A server that was never ready: nothing outside is due to send it input, so waiting for some is
    # no idleness (the assessor knows; `hangwatch stacks` does not, and says idle).
    before_ready: bool = False
    # (pid, port, seconds): a member listening on a port where a connection's bytes have sat unread in
    # the kernel this long (or where a connection waits, never accepted): that member is not reading.
    unread: tuple[tuple[int, int, float], ...] = ()
    # The world the launcher's command line expects (more than one node), for what never came.
    world: ExpectedWorld | None = None
    # (pid, path, holder pid, holder's command or None inside the tree): a member holds a file open whose
    # lock another process holds (/proc/locks), at the latest capture: a poller's lock and who has it.
    locks: tuple[tuple[int, str, int, str | None], ...] = ()
    # Pairs of members connected to each other by a loopback TCP connection (both ends the tree's): the
    # ranks of one gloo or NCCL group are, whatever names them (torch.multiprocessing.spawn names none).
    linked: frozenset[tuple[int, int]] = frozenset()
    # (pid, port): the TCP ports each member listens on, at the latest tick: where work from outside
    # the tree comes in.
    listening: tuple[tuple[int, int], ...] = ()
    # Members whose main thread is blocked in accept() at the latest capture, as the kernel shows it:
    # waiting for the next connection on a socket it listens on (the kernel's receive calls do not
    # include accept, yet nothing waits for input from outside more plainly).
    accepting: frozenset[int] = frozenset()
    # Lock files in the build and cache folders that no process holds, at the latest capture
    # (collect/lockfiles.py): markers a killed build may have left, which a poller waits to go away.
    lock_files: tuple[LockFile, ...] = ()

    # Worked out once per context, not per rule: the rules ask for them again and again, and each is a
    # pass over every view (10,000 at 10,000 ranks).
    @cached_property
    def peers(self) -> tuple[ProcessView, ...]:
        ranked = tuple(v for v in self.views if v.peer)
        return ranked or self.views

    @cached_property
    def cpu_of(self) -> dict[int, float]:
        """``window_cpu`` as a mapping, for the rules that ask it per view."""
        return dict(self.window_cpu)

    @cached_property
    def _labels(self) -> dict[int, list[str]]:
        """Each pid's view labels."""
        labels: dict[int, list[str]] = {}
        for v in self.views:
            labels.setdefault(v.pid, []).append(v.label)
        return labels

    def label(self, pids: Iterable[int]) -> str:
        wanted = set(pids)
        labels = self._labels
        # Looked up by pid rather than by a pass over every view: compact_ranges' text does not depend
        # on the order of its labels.
        names = [name for pid in wanted for name in labels.get(pid, ())]
        names += [f"{e.name}[{e.pid}]" for e in self.exits if e.pid in wanted and e.pid not in labels]
        return compact_ranges(names) or ",".join(str(p) for p in sorted(wanted))

    @property
    def over_time(self) -> bool:
        return self.samples >= 2

    def confidence(self, *pids: int) -> Confidence:
        if not self.over_time:
            return Confidence.MEDIUM
        wanted = set(pids)
        views = [v for v in self.views if v.pid in wanted] if wanted else list(self.views)
        ok = all(v.unchanged or v.outcome is not DumpOutcome.OK for v in views)
        return Confidence.HIGH if ok else Confidence.MEDIUM

    def all_blocked(self) -> bool:
        """Every process of the tree waits: dumped and not moving, stopped, dead, or not Python and idle.

        A process whose stacks could not be read (permission, timeout, py-spy failing) could be the one
        doing something: then nothing is proven, and the full stall window applies. So could a starved
        loop: on a real Slurm job (two ranks on one emulated node of 2 loaded cores) three stack rounds
        caught both ranks on the same line of their CPU loop at under 0.1 core, the others waiting for
        them in the all_reduce, and the job was called closed-stalled while it still looped.
        """
        if not self.over_time:
            return False
        cpu = self.cpu_of
        for v in self.views:
            if v.outcome is DumpOutcome.OK:
                if not v.blocked or v.starved:
                    return False
            elif v.outcome in (DumpOutcome.STOPPED, DumpOutcome.GONE) or v.state == ProcState.ZOMBIE:
                continue
            elif v.outcome is not DumpOutcome.NOT_PYTHON:
                return False
            elif (
                v.state in (ProcState.RUNNING, ProcState.DISK_SLEEP) or cpu.get(v.pid, 0.0) >= CPU_BUSY_CORES
            ):
                return False  # a shell wrapper is fine; a busy non-Python child (ninja, nvcc) is not
        return True


@dataclass(frozen=True)
class Prepared:
    """The views of every process and the kernel's wait graph, made elsewhere from the same captures and
    ticks: the merge across nodes makes them node by node as the answers arrive (analyse/nodes.py), each
    node's on its own clock, so what is left after the last answer is the passes over every rank that
    need them all."""

    views: tuple[ProcessView, ...]
    waits: WaitGraph | None


def stack_context(
    samples: Sequence[StackSample],
    window: Sequence[Tick] = (),
    exits: Sequence[ExitRecord] = (),
    prepared: Prepared | None = None,
) -> StackContext:
    with paused_gc:  # thousands of views per call at 10,000 ranks, none in a cycle (model/stacks.py)
        return _stack_context(samples, window, exits, prepared)


def _stack_context(
    samples: Sequence[StackSample],
    window: Sequence[Tick],
    exits: Sequence[ExitRecord],
    prepared: Prepared | None,
) -> StackContext:
    parents = tuple(sorted({p.pid: p.ppid for t in window for p in t.processes}.items()))
    if prepared is None:
        flowing = data_flowing(window, samples[0].t, samples[-1].t) if samples else frozenset()
        prepared = Prepared(process_views(samples, flowing), wait_graph(samples, dict(parents)))
    span = samples[-1].t - samples[0].t if samples else 0.0
    states: dict[int, str] = {}
    cpu: dict[int, float] = {}
    if window:
        for tick in window:
            for p in tick.processes:
                cpu[p.pid] = cpu.get(p.pid, 0.0) + p.cpu_delta_s
        states = {p.pid: p.state for p in window[-1].processes}
        seconds = max(window[-1].t - window[0].t, 1.0)
        cpu = {pid: c / seconds for pid, c in cpu.items()}
    d_state = io_waiting_processes(window)
    gpu = next((t.gpu for t in reversed(window) if t.gpu is not None), None)
    # A few ticks, not the whole window: a rank that computed before it got stuck ran kernels then.
    recent = [p for t in window[-KERNEL_TICKS:] if t.gpu is not None for p in t.gpu.processes]
    known = [p for p in recent if p.sm_util_pct is not None]
    kernels = frozenset(p.pid for p in known if p.sm_util_pct) if known else None
    waiting, read = _requests_waiting(window)
    return StackContext(
        views=prepared.views,
        samples=len(samples),
        span_s=span,
        exits=tuple(e for e in exits if e.failed or ended_unseen(e)),
        states=tuple(sorted(states.items())),
        d_state=d_state,
        window_cpu=tuple(sorted(cpu.items())),
        gpu=gpu,
        kernels=kernels,
        gpm=samples[-1].gpus if samples else (),
        parents=parents,
        requests_waiting=waiting,
        connections_read=read,
        waits=prepared.waits,
        unread=_unread(window),
        # Each distinct command line once: 10,000 ranks run a handful.
        world=expected_world(list(dict.fromkeys(p.cmdline for p in window[-1].processes)))
        if window
        else None,
        locks=_locks_held_by_others(samples[-1]) if samples else (),
        linked=_tcp_linked(samples[-1]) if samples else frozenset(),
        listening=_listening(window[-1]) if window else (),
        accepting=_accepting(samples[-1]) if samples else frozenset(),
        lock_files=samples[-1].lock_files if samples else (),
    )


def _listening(tick: Tick) -> tuple[tuple[int, int], ...]:
    return tuple(
        (p.pid, port) for p in tick.processes if p.state not in ENDED_STATES for port in p.listening_ports
    )


_ACCEPT_CALLS = frozenset({"accept", "accept4"})


def _accepting(sample: StackSample) -> frozenset[int]:
    return frozenset(p.pid for p in sample.processes if p.kernel is not None and _accepts(p.kernel))


def _accepts(kernel: ProcessWaits) -> bool:
    """Its main thread is in accept()."""
    main = kernel.main()
    return main is not None and main.call in _ACCEPT_CALLS


def _tcp_linked(sample: StackSample) -> frozenset[tuple[int, int]]:
    if not sample.tcp_peers:
        return frozenset()  # across nodes: the merge carries no node's peers
    owner = {inode: p.pid for p in sample.processes if p.kernel is not None for inode in p.kernel.sockets}
    pairs = set()
    for inode, peer in sample.tcp_peers:
        a, b = owner.get(inode), owner.get(peer)
        if a is not None and b is not None and a != b:
            pairs |= {(a, b), (b, a)}
    return frozenset(pairs)


def _locks_held_by_others(sample: StackSample) -> tuple[tuple[int, str, int, str | None], ...]:
    if not sample.lock_holders:
        return ()
    holders: dict[str, set[int]] = {}
    for key, pid in sample.lock_holders:
        holders.setdefault(key, set()).add(pid)
    owners = dict(sample.lock_owners)
    out = []
    for p in sample.processes:
        for entry in p.kernel.files if p.kernel is not None else ():
            key, _, path = entry.partition(" ")
            for holder in sorted(holders.get(key, set()) - {p.pid}):
                out.append((p.pid, path, holder, owners.get(holder)))
    return tuple(out)


# A server's event loop reads what arrives within a tick; bytes left unread this long mean nobody reads.
UNREAD_S = 3.0


def _unread(window: Sequence[Tick]) -> tuple[tuple[int, int, float], ...]:
    """The members listening on ports where bytes waited unread in the window (hangwatch's own probes
    included: a probe the server never reads is as good a witness as a client's request, though it
    gives up and closes after its timeout, so any tick of the window counts, not only the latest)."""
    oldest: dict[int, float] = {}
    for tick in window:
        for c in tick.connections.connections if tick.connections is not None else ():
            if c.unread_s is not None and c.unread_s >= UNREAD_S and not c.internal:
                oldest[c.port] = max(oldest.get(c.port, 0.0), c.unread_s)
    if not oldest:
        return ()
    last = window[-1]
    return tuple(
        (p.pid, port, oldest[port])
        for p in last.processes
        for port in p.listening_ports
        if port in oldest and p.state not in ENDED_STATES
    )


def _requests_waiting(window: Sequence[Tick]) -> tuple[tuple[str, ...], bool]:
    """What the latest tick says of requests waiting for an answer, and whether connections were read."""
    seen = next((t for t in reversed(window) if t.connections is not None), None)
    waiting: list[str] = []
    read = seen is not None and seen.connections is not None and seen.connections.error is None
    if seen is not None and seen.connections is not None and seen.connections.unanswered:
        oldest = max(c.unanswered_s or 0.0 for c in seen.connections.unanswered)
        waiting.append(
            f"{len(seen.connections.unanswered)} client connection(s) sent a request and got no answer "
            f"(the oldest for {oldest:.0f} s)"
        )
    own = window[-1].own_request if window else None
    pending = own.pending_for(window[-1].t) if own is not None else None
    if pending is not None and pending >= OWN_REQUEST_SLOW_S:
        waiting.append(f"hangwatch's own request pending for {pending:.0f} s")
    return tuple(waiting), read
