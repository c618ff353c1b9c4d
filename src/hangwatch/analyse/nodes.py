"""Merge the bundles of several nodes into the samples the one-node analysis consumes, then analyse them.

Pids repeat across nodes (and across pid namespaces on one host), so every process gets a key unique in
the merge: ``node index * KEY_STRIDE + pid`` (``pid_max`` is at most 2**22, under the stride), with the
table back to (node, pid namespace, pid) kept beside the samples. Ranks are relabelled with their node
(``hwn2:rank3``), so the stack tree's ranges and the rules' texts say where each rank is; round i of
every node becomes round i of the merged samples. The cause rules then run unchanged over all ranks
together: a rank on node 3 that never entered the all_reduce the others wait in is the odd one out of
the whole job, not of its node. A process's kernel waits keep its node's numbering (tids, children,
pipe and socket inodes, which another node may number the same): the analysis shifts them by the
process's key less their pid (``ProcessStacks.kernel``), and keeps each node's pipes and sockets apart.
Copying every thread's wait of 10,000 ranks was 0.2 s of a 0.5 s goal (docs/stacks.md).

All of that is one node's business: its copies under merge keys, its processes' views (a view reads its
own process's captures) and kernel waits (no wait crosses nodes), its ranks for the census. Each node's
part (``NodePart``) is made as its answer arrives, in the fan-out's worker threads while the other nodes
are still collecting (``NodeParts``, nodes/gather.py), and what is left after the last answer is what
needs every rank at once: the rules, the tree, the census's order. A part made on arrival under what the
merge then decides otherwise (a label, how many rounds or ticks) is made again at the merge. A part knows
no more than the merged samples do: each node's socket peers and lock holders stay out of its wait facts,
as the merge carries none (the rest of the analysis reads the merged samples), and its ticks are the
merged window's (every node's first ticks, as many as every node has).

Beside the stacks: which ranks of the world checked in, on which node, and who is missing (a node that
did not answer may hold them, and is named); each node's clock skew, bounded by the exchange's times.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from operator import attrgetter
from typing import TypeVar

from hangwatch.analyse import causes
from hangwatch.analyse.causes import Diagnosis
from hangwatch.analyse.progress import data_flowing
from hangwatch.analyse.stackcontext import Prepared
from hangwatch.analyse.stackcontext import stack_context
from hangwatch.analyse.stackranks import peer_pids
from hangwatch.analyse.stackrules import classify
from hangwatch.analyse.stacktree import build_tree
from hangwatch.analyse.stacktree import unchanged_threads
from hangwatch.analyse.stackwaits import Histories
from hangwatch.analyse.stackwaits import ProcessView
from hangwatch.analyse.stackwaits import process_views
from hangwatch.analyse.stackwaits import with_peers
from hangwatch.analyse.stackwatch import Borrowed
from hangwatch.analyse.stackwatch import NativeDetail
from hangwatch.analyse.waitgraph import WaitFacts
from hangwatch.analyse.waitgraph import graph_of
from hangwatch.analyse.waitgraph import wait_facts
from hangwatch.model.nodes import NODES_REPORT_SCHEMA
from hangwatch.model.nodes import ClockSkew
from hangwatch.model.nodes import NodeBundle
from hangwatch.model.nodes import NodeResult
from hangwatch.model.nodes import NodesDiagnosis
from hangwatch.model.nodes import NodesReport
from hangwatch.model.nodes import NodeSummary
from hangwatch.model.nodes import ProcessKey
from hangwatch.model.nodes import RankCensus
from hangwatch.model.nodes import RankPlace
from hangwatch.model.samples import ExitRecord
from hangwatch.model.samples import ProcessSample
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import StackTree
from hangwatch.model.stacks import ThreadStack
from hangwatch.model.stacks import paused_gc
from hangwatch.model.stacks import replaced
from hangwatch.ranges import rank_ranges
from hangwatch.ranges import ranks_label
from hangwatch.words import human_bytes
from hangwatch.words import plural

T = TypeVar("T")
KEY_STRIDE = 10_000_000


@dataclass(frozen=True)
class MergedNodes:
    nodes: tuple[NodeSummary, ...]
    samples: tuple[StackSample, ...]  # round i of every node that answered with stacks
    ticks: tuple[Tick, ...]
    keys: dict[int, ProcessKey]  # merged key -> where the process really is
    census: RankCensus


@dataclass(frozen=True)
class NodesAnalysis:
    merged: MergedNodes
    diagnosis: Diagnosis
    tree: StackTree


def node_labels(results: Sequence[NodeResult]) -> list[str]:
    """The node's own hostname (what its logs say); the host as given where hostnames repeat (containers)."""
    names = [r.bundle.node.hostname if r.bundle is not None else r.host for r in results]
    counts = Counter(names)
    return [name if counts[name] == 1 else r.host for name, r in zip(names, results, strict=True)]


def clock_skew(result: NodeResult) -> ClockSkew | None:
    """The collector read its clock somewhere between our send and our receive less its run time.

    And at least as long after our send as the collector's process had been running (its interpreter's
    start and imports, which follow the ssh handshake). An interval, not a point: what is left of it is
    mostly the handshake, before the process existed; the bound is what is certain. A persistent
    connection (ssh ControlMaster) narrows it.
    """
    if result.bundle is None:
        return None
    clock = result.bundle.clock
    latest = max(result.sent_wall_s, result.received_wall_s - clock.duration_s)
    earliest = min(result.sent_wall_s + clock.since_exec_s, latest)
    middle = (earliest + latest) / 2
    return ClockSkew(offset_s=round(clock.wall_s - middle, 4), bound_s=round((latest - earliest) / 2, 4))


def merge(results: Sequence[NodeResult], parts: NodeParts | None = None) -> MergedNodes:
    """The nodes merged, with each rank's wait in the census (the parts' views, made anyway)."""
    summaries, samples, ticks, keys, made = _merge(results, parts)
    return MergedNodes(summaries, samples, ticks, keys, census(made))


@dataclass(frozen=True)
class PartMemos:
    """What every node's part shares (``node_part``): the distinct thread histories of the views, and the
    native frames a Python-only capture's thread borrows, per pair of stacks (``NativeDetail``)."""

    histories: Histories = field(default_factory=Histories)
    borrowed: Borrowed = field(default_factory=dict)


@dataclass(frozen=True)
class NodePart:
    """One node's share of the merge: its summary, its processes' keys, its rounds and ticks copied under
    those keys, and the views and kernel waits of its processes (``node_part``).

    Each depends on the node's own answer, its index and label, and how many rounds and ticks are merged,
    never on another node's processes: the nodes' waits do not cross (each node's pipes and children are
    its own; the merge carries no socket peers), and a process's view reads its own captures and ticks.
    So a part is made as the node's answer arrives (``NodeParts``), while the others are still collecting,
    and what is left after the last answer is what needs every rank at once (the rules, the tree, the
    census)."""

    index: int
    label: str
    result: NodeResult
    rounds: int  # the stack rounds merged (every node's first ``rounds``)
    tick_count: int  # the ticks merged, likewise
    summary: NodeSummary
    keys: dict[int, ProcessKey]
    samples: tuple[StackSample, ...]  # the latest with the native detail of the earlier ones
    ticks: tuple[Tick, ...]
    views: tuple[ProcessView, ...]  # of the latest round's processes, in its order
    waits: WaitFacts | None  # None: some live process's waits were not read, or fewer than two rounds
    # The node's global ranks (each with its main thread's wait, where its stacks were read), and the
    # largest world size its ranks name: the census's share of the node.
    places: tuple[RankPlace, ...] = ()
    world: int | None = None
    # Its threads with the same Python stack in every round (stacktree.unchanged_threads), for the tree.
    still: frozenset[tuple[int, int]] = frozenset()


def _rounds_of(result: NodeResult) -> int:
    return len(result.bundle.stacks) if result.bundle is not None else 0


def _ticks_of(result: NodeResult) -> int:
    return len(result.bundle.ticks) if result.bundle is not None else 0


def node_part(
    index: int,
    label: str,
    result: NodeResult,
    rounds: int,
    tick_count: int,
    *,
    memos: PartMemos | None = None,
) -> NodePart:
    """The node's part of the merge at ``index`` under ``label``, of its first ``rounds`` stack rounds and
    first ``tick_count`` ticks.
    ``memos``: what the parts share, worked out once for all nodes (their ranks in one wait share their
    stacks and thread histories)."""
    memos = PartMemos() if memos is None else memos
    bundle = result.bundle
    elapsed = round(result.received_wall_s - result.sent_wall_s, 4)
    if bundle is None:
        summary = NodeSummary(
            label, result.host, result.outcome, result.detail, None, 0, (), "", None, elapsed, None
        )
        return NodePart(index, label, result, 0, 0, summary, {}, (), (), (), None)
    offset = (index + 1) * KEY_STRIDE
    keys = {offset + p.pid: ProcessKey(label, bundle.node.pid_ns, p.pid) for p in bundle.processes}
    moved: dict[ThreadKey, ThreadStack] = {}
    # The rounds the merge keeps (every node's first ``rounds``); the latest of them borrows the earlier
    # rounds' native frames as it is copied (stackwatch.with_native_detail, in the same copy).
    kept = bundle.stacks[:rounds]
    detail = NativeDetail(kept[:-1], memos.borrowed)
    samples = tuple(
        relabel_stacks(s, offset, label, moved, detail if i == len(kept) - 1 else None)
        for i, s in enumerate(kept)
    )
    ticks = tuple(relabel_tick(t, offset, label) for t in bundle.ticks[:tick_count])
    views: tuple[ProcessView, ...] = ()
    waits = None
    if samples:
        # The node's own ticks and rounds, on its own clock: which of its processes moved data all through
        # its rounds, and who each of them waits for in the kernel, of what the merged samples carry.
        flowing = data_flowing(ticks, samples[0].t, samples[-1].t)
        views = process_views(samples, flowing, histories=memos.histories)
        waits = wait_facts(_as_merged(samples), {p.pid: p.ppid for t in ticks for p in t.processes})
    # Where each rank waits, from the views the rules use (computing them again would double the cost).
    where = {v.pid: v.main.where for v in views if v.main is not None}
    places = []
    for p in bundle.processes:
        rank = _global_rank(p.rank)
        if rank is not None:
            key = offset + p.pid
            places.append(RankPlace(rank, label, bundle.node.pid_ns, p.pid, key, where.get(key, "")))
    sizes = [p.world_size for p in bundle.processes if p.world_size]
    ranks = tuple(p.rank for p in bundle.processes if p.rank is not None)
    summary = NodeSummary(
        label=label,
        host=result.host,
        outcome=result.outcome,
        detail=result.detail,
        pid_ns=bundle.node.pid_ns,
        processes=len(bundle.processes),
        ranks=ranks,
        rank_label=ranks_label(ranks),
        skew=clock_skew(result),
        elapsed_s=elapsed,
        collect_s=bundle.clock.duration_s,
        errors=bundle.errors,
        gpus=gpu_line(bundle),
        probe=probe_line(bundle),
    )
    world = max(sizes) if sizes else None
    return NodePart(
        index=index,
        label=label,
        result=result,
        rounds=len(samples),
        tick_count=len(ticks),
        summary=summary,
        keys=keys,
        samples=samples,
        ticks=ticks,
        views=views,
        waits=waits,
        places=tuple(places),
        world=world,
        still=frozenset(unchanged_threads(samples)),
    )


class NodeParts:
    """Each node's part of the merge, made as its answer arrives: ``add`` is the fan-out's last step for
    a node, after the decoding, in the transport's worker thread (nodes/gather.py).

    A part is made under the node's own hostname and its position among ``hosts``, with every round and
    tick it sent; the merge takes it where those are what the merge decides (the usual case), and makes
    the part again where they are not: two nodes of one hostname (labelled by host instead), another node
    with fewer rounds or ticks than this one (cut short by its deadline), a host named twice, a result the
    caller replaced."""

    def __init__(self, hosts: Sequence[str]) -> None:
        self._index: dict[str, list[int]] = {}
        for index, host in enumerate(hosts):
            self._index.setdefault(host, []).append(index)
        self._parts: dict[int, NodePart] = {}
        self.memos = PartMemos()
        # Answers are finished in several worker threads at once; a part is made under the lock, which
        # also guards what the parts share (the interpreter runs one of them at a time anyway).
        self._lock = threading.Lock()

    def add(self, result: NodeResult) -> NodeResult:
        """Make the node's part, and hand its result on unchanged."""
        if result.bundle is None:
            return result
        with self._lock, paused_gc:
            # A host named twice: its answers take its places in turn (the merge checks whose it is).
            index = next((i for i in self._index.get(result.host, ()) if i not in self._parts), None)
            if index is None:
                return result
            # An early part is only a head start: one that fails is made again by the merge, where its
            # error is the analysis's own, and the answer goes on unchanged whatever happened here.
            with contextlib.suppress(Exception):
                self._parts[index] = node_part(
                    index,
                    result.bundle.node.hostname,
                    result,
                    _rounds_of(result),
                    _ticks_of(result),
                    memos=self.memos,
                )
        return result

    def part(
        self, index: int, label: str, result: NodeResult, rounds: int, tick_count: int
    ) -> NodePart | None:
        """The part made on arrival, where it is the one the merge needs."""
        found = self._parts.get(index)
        if (
            found is None
            or found.result is not result
            or found.label != label
            or found.rounds != rounds
            or found.tick_count != tick_count
        ):
            return None
        return found


def _merge(
    results: Sequence[NodeResult], parts: NodeParts | None
) -> tuple[
    tuple[NodeSummary, ...],
    tuple[StackSample, ...],
    tuple[Tick, ...],
    dict[int, ProcessKey],
    list[NodePart],
]:
    """``merge`` but the census: the summaries, merged samples and ticks, the keys, and each node's part
    (made now where ``parts`` has none that fits)."""
    labels = node_labels(results)
    # Round i of every node is merged for the rounds every node has (a node cut short by its deadline
    # has fewer).
    count = min((_rounds_of(r) for r in results if r.bundle and r.bundle.stacks), default=0)
    ticked = min((_ticks_of(r) for r in results if r.bundle and r.bundle.ticks), default=0)
    memos = parts.memos if parts is not None else PartMemos()
    made: list[NodePart] = []
    keys: dict[int, ProcessKey] = {}
    for index, (label, result) in enumerate(zip(labels, results, strict=True)):
        rounds, tick_count = min(count, _rounds_of(result)), min(ticked, _ticks_of(result))
        part = parts.part(index, label, result, rounds, tick_count) if parts is not None else None
        if part is None:
            part = node_part(index, label, result, rounds, tick_count, memos=memos)
        made.append(part)
        keys.update(part.keys)
    samples = _rounds([part.samples for part in made if part.result.bundle is not None], _merge_samples)
    ticks = _rounds([part.ticks for part in made if part.result.bundle is not None], _merge_ticks)
    return tuple(part.summary for part in made), samples, ticks, keys, made


def gpu_line(bundle: NodeBundle) -> str:
    """The node's GPUs in one line, or why none was read ("" when the bundle carries no reading)."""
    sample = bundle.gpu
    if sample is None:
        return ""
    if sample.unavailable:
        return f"no GPU reading: {sample.unavailable}"
    utils = [g.util_pct for g in sample.gpus if g.util_pct is not None]
    used = sum(g.mem_used_bytes or 0 for g in sample.gpus)
    util = f"util {min(utils):.0f}-{max(utils):.0f} %" if utils else "util unknown"
    line = f"{plural(len(sample.gpus), 'GPU')}: {util}, {human_bytes(used)} used"
    return line + (f"; read errors: {sample.error}" if sample.error else "")


def probe_line(bundle: NodeBundle) -> str:
    """The engine's readiness URL as the node answered it; a dummy answer says why it does not count."""
    if not bundle.probes:
        return ""
    probe = bundle.probes[0]
    line = f"{probe.probe.url}: {probe.probe.describe()}"
    return line + (f" ({probe.dummy})" if probe.dummy else "")


def analyse(results: Sequence[NodeResult], parts: NodeParts | None = None) -> NodesAnalysis:
    """The one-node analysis over every node's ranks at once. ``parts``: the nodes' parts made as their
    answers arrived (``NodeParts``); whatever it lacks is made here."""
    with paused_gc:  # every rank's samples copied under its merge key: no cycles (model/stacks.py)
        return _analyse(results, parts)


def _analyse(results: Sequence[NodeResult], parts: NodeParts | None) -> NodesAnalysis:
    summaries, merged_samples, ticks, keys, made = _merge(results, parts)
    analysed = list(merged_samples)  # the latest round with the native detail the merge gave it
    exits = tuple(e for tick in ticks for e in tick.exits)
    stacked = [part for part in made if part.samples]
    views = tuple(v for part in stacked for v in part.views)
    if analysed:
        # Which processes are the ranks is the whole job's to say, not each node's.
        views = with_peers(views, peer_pids(analysed[-1].processes))
    waits = graph_of([part.waits for part in stacked]) if len(analysed) >= 2 else None
    context = stack_context(analysed, ticks, exits, Prepared(views, waits))
    diagnosis = classify(context)
    still = set().union(*(part.still for part in stacked))
    tree = build_tree(analysed, highlight=diagnosis.culprits or None, still=still)
    merged = MergedNodes(summaries, merged_samples, ticks, keys, census(made))
    return NodesAnalysis(merged, diagnosis, tree)


def report_of(results: Sequence[NodeResult], selector: str, parts: NodeParts | None = None) -> NodesReport:
    """The analysis across nodes as the model the renderers take."""
    analysis = analyse(results, parts)
    d = analysis.diagnosis
    return NodesReport(
        schema=NODES_REPORT_SCHEMA,
        selector=selector,
        nodes=analysis.merged.nodes,
        ranks=analysis.merged.census,
        processes=analysis.merged.keys,
        diagnosis=NodesDiagnosis(d.cause, d.confidence, d.explanation, d.culprits, d.rules, d.near),
        # Not the advice to take stacks: this is stacks across nodes.
        next_steps=causes.steps_after_stacks(d.steps or causes.NEXT_STEPS.get(d.cause, ())),
        stack_tree=analysis.tree,
    )


def census(parts: Sequence[NodePart]) -> RankCensus:
    """Which global ranks were found where (each node's ``places``); the world size from the ranks'
    WORLD_SIZE."""
    found = [place for part in parts for place in part.places]
    found.sort(key=attrgetter("rank", "node"))
    silent = [part.label for part in parts if part.result.bundle is None]
    sizes = [part.world for part in parts if part.world is not None]
    world = max(sizes) if sizes else None
    # Counted, not searched: 10,000 ranks must not cost 10,000 squared.
    counts = Counter(r.rank for r in found)
    missing = tuple(r for r in range(world) if r not in counts) if world else ()
    duplicated = tuple(sorted(r for r, n in counts.items() if n > 1))
    by_node: dict[str, list[int]] = {}
    for r in found:
        by_node.setdefault(r.node, []).append(r.rank)
    return RankCensus(
        world,
        tuple(found),
        missing,
        duplicated,
        tuple(silent),
        by_node=tuple((node, rank_ranges(ranks)) for node, ranks in by_node.items()),
        missing_label=rank_ranges(missing),
        duplicated_label=rank_ranges(duplicated),
    )


def _global_rank(rank: str | None) -> int | None:
    """The job-wide rank a profile's rank names: ``3`` (RANK), ``TP3`` (a TP rank across nodes)."""
    digits = rank[2:] if rank is not None and rank.startswith("TP") else rank
    return int(digits) if digits and digits.isascii() and digits.isdigit() else None


def _label(label: str, rank: str | None) -> str | None:
    if rank is None:
        return None
    return f"{label}:rank{rank}" if rank.isdigit() else f"{label}:{rank}"


# A thread as the merge copies it: every field of ``ThreadStack`` (its frames tuple by identity).
ThreadKey = tuple[int, str | None, bool, bool, int]


def relabel_stacks(
    sample: StackSample,
    offset: int,
    label: str,
    moved: dict[ThreadKey, ThreadStack] | None = None,
    detail: NativeDetail | None = None,
) -> StackSample:
    """The sample with its pids and tids moved by ``offset`` and its ranks named with the node's label;
    its kernel waits as they were, in the node's numbering (``ProcessStacks.kernel``).

    ``moved``: the threads already moved for the node's earlier rounds, shared by its rounds. A thread
    that stayed where it was (every thread of a hung rank) is equal in every round, and copied once.
    ``detail``: the native frames the threads of a Python-only capture borrow from the node's earlier
    rounds (``with_native_detail``): a thread in place then has its first round's frames, and its copy.
    """
    moved = {} if moved is None else moved
    processes = []
    for p in sample.processes:
        lender = detail if detail and not p.native else None
        threads = []
        for t in p.threads:
            frames = t.frames
            if lender is not None:
                frames = lender.frames(p.pid, t) or frames
            key = (t.tid, t.name, t.active, t.owns_gil, id(frames))  # the copy holds the frames: id stays
            copy = moved.get(key)
            if copy is None:
                copy = moved[key] = replaced(t, tid=offset + t.tid, frames=frames)
            threads.append(copy)
        role = f"{label}:{p.role or p.name}" if p.rank is None else p.role
        processes.append(
            replaced(
                p,
                pid=offset + p.pid,
                threads=tuple(threads),
                rank=_label(label, p.rank),
                role=role,
            )
        )
    return replaced(sample, processes=tuple(processes))


def relabel_tick(tick: Tick, offset: int, label: str) -> Tick:
    def process(p: ProcessSample) -> ProcessSample:
        return replaced(p, pid=offset + p.pid, ppid=offset + p.ppid, rank=_label(label, p.rank))

    def exit_(e: ExitRecord) -> ExitRecord:
        return replace(e, pid=offset + e.pid, name=f"{label}:{e.name}", rank=_label(label, e.rank))

    return replaced(
        tick,
        processes=tuple(process(p) for p in tick.processes),
        exits=tuple(exit_(e) for e in tick.exits),
    )


def _as_merged(samples: Sequence[StackSample]) -> tuple[StackSample, ...]:
    """The node's rounds without what the merged samples leave out (``_merge_samples``): its socket peers
    and lock holders, in its own numbering, which the rest of the analysis across nodes never sees (the
    TCP links of ranks, the locks held by others). Read by one part's wait facts alone, they would make
    verdicts no merged analysis makes."""
    return tuple(
        replaced(s, unix_peers=(), tcp_peers=(), lock_holders=(), lock_owners=())
        if s.unix_peers or s.tcp_peers or s.lock_holders or s.lock_owners
        else s
        for s in samples
    )


def _rounds(per_node: list[tuple[T, ...]], join: Callable[[list[T]], T]) -> tuple[T, ...]:
    """Round i of every node, for the rounds every node has (a node cut short by its deadline has fewer)."""
    with_rounds = [rounds for rounds in per_node if rounds]
    if not with_rounds:
        return ()
    count = min(len(r) for r in with_rounds)
    return tuple(join([r[i] for r in with_rounds]) for i in range(count))


def _merge_samples(parts: list[StackSample]) -> StackSample:
    return StackSample(
        t=round(sum(s.t for s in parts) / len(parts), 4),
        processes=tuple(p for s in parts for p in s.processes),
        elapsed_s=max(s.elapsed_s for s in parts),
        gpus=tuple(g for s in parts for g in s.gpus),
    )


def _merge_ticks(parts: list[Tick]) -> Tick:
    return Tick(
        t=round(sum(t.t for t in parts) / len(parts), 4),
        processes=tuple(p for t in parts for p in t.processes),
        exits=tuple(e for t in parts for e in t.exits),
    )
