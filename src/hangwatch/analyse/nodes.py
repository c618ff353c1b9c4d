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

Beside the stacks: which ranks of the world checked in, on which node, and who is missing (a node that
did not answer may hold them, and is named); each node's clock skew, bounded by the exchange's times.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace
from operator import attrgetter
from typing import TypeVar

from hangwatch.analyse import causes
from hangwatch.analyse.causes import Diagnosis
from hangwatch.analyse.stackcontext import stack_context
from hangwatch.analyse.stackrules import classify
from hangwatch.analyse.stacktree import build_tree
from hangwatch.analyse.stackwatch import NativeDetail
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


def merge(results: Sequence[NodeResult]) -> MergedNodes:
    labels, summaries, samples, ticks, keys = _merge(results)
    return MergedNodes(summaries, samples, ticks, keys, census(results, labels))


def _merge(
    results: Sequence[NodeResult],
) -> tuple[
    list[str], tuple[NodeSummary, ...], tuple[StackSample, ...], tuple[Tick, ...], dict[int, ProcessKey]
]:
    """``merge`` but the census: the node labels, summaries, merged samples and ticks, and the keys."""
    labels = node_labels(results)
    # Round i of every node is merged for the rounds every node has (a node cut short by its deadline
    # has fewer).
    count = min((len(r.bundle.stacks) for r in results if r.bundle and r.bundle.stacks), default=0)
    keys: dict[int, ProcessKey] = {}
    summaries: list[NodeSummary] = []
    per_node_samples: list[tuple[StackSample, ...]] = []
    per_node_ticks: list[tuple[Tick, ...]] = []
    for index, (label, result) in enumerate(zip(labels, results, strict=True)):
        bundle = result.bundle
        elapsed = round(result.received_wall_s - result.sent_wall_s, 4)
        if bundle is None:
            summaries.append(
                NodeSummary(
                    label, result.host, result.outcome, result.detail, None, 0, (), "", None, elapsed, None
                )
            )
            continue
        offset = (index + 1) * KEY_STRIDE
        for p in bundle.processes:
            keys[offset + p.pid] = ProcessKey(label, bundle.node.pid_ns, p.pid)
        moved: dict[ThreadKey, ThreadStack] = {}
        # The rounds the merge keeps (every node's first ``count``); the latest of them borrows the earlier
        # rounds' native frames as it is copied (stackwatch.with_native_detail, in the same copy).
        rounds = bundle.stacks[:count]
        detail = NativeDetail(rounds[:-1])
        per_node_samples.append(
            tuple(
                relabel_stacks(s, offset, label, moved, detail if i == len(rounds) - 1 else None)
                for i, s in enumerate(rounds)
            )
        )
        per_node_ticks.append(tuple(relabel_tick(t, offset, label) for t in bundle.ticks))
        ranks = tuple(p.rank for p in bundle.processes if p.rank is not None)
        summaries.append(
            NodeSummary(
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
        )
    samples = _rounds(per_node_samples, _merge_samples)
    ticks = _rounds(per_node_ticks, _merge_ticks)
    return labels, tuple(summaries), samples, ticks, keys


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


def analyse(results: Sequence[NodeResult]) -> NodesAnalysis:
    """The one-node analysis over every node's ranks at once."""
    with paused_gc:  # every rank's samples copied under its merge key: no cycles (model/stacks.py)
        return _analyse(results)


def _analyse(results: Sequence[NodeResult]) -> NodesAnalysis:
    labels, summaries, merged_samples, ticks, keys = _merge(results)
    analysed = list(merged_samples)  # the latest round with the native detail the merge gave it
    exits = tuple(e for tick in ticks for e in tick.exits)
    context = stack_context(analysed, ticks, exits)
    diagnosis = classify(context)
    tree = build_tree(analysed, highlight=diagnosis.culprits or None)
    # Where each rank waits, from the views the rules used (computing them again would double the cost),
    # put in the census as it is taken (copying 10,000 places to add it was 3 % of the analysis).
    where = {v.pid: v.main.where for v in context.views if v.main is not None}
    merged = MergedNodes(summaries, merged_samples, ticks, keys, census(results, labels, where))
    return NodesAnalysis(merged, diagnosis, tree)


def report_of(results: Sequence[NodeResult], selector: str) -> NodesReport:
    """The analysis across nodes as the model the renderers take."""
    analysis = analyse(results)
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


def census(
    results: Sequence[NodeResult], labels: Sequence[str], where: dict[int, str] | None = None
) -> RankCensus:
    """Which global ranks were found where; the world size from the ranks' WORLD_SIZE. ``where``: each
    merged key's main thread's wait, where the stacks were analysed."""
    found: list[RankPlace] = []
    sizes: list[int] = []
    silent: list[str] = []
    for index, (label, result) in enumerate(zip(labels, results, strict=True)):
        if result.bundle is None:
            silent.append(label)
            continue
        offset = (index + 1) * KEY_STRIDE
        for p in result.bundle.processes:
            if p.world_size:
                sizes.append(p.world_size)
            rank = _global_rank(p.rank)
            if rank is None:
                continue
            key = offset + p.pid
            wait = where.get(key, "") if where is not None else ""
            found.append(RankPlace(rank, label, result.bundle.node.pid_ns, p.pid, key, wait))
    found.sort(key=attrgetter("rank", "node"))
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
