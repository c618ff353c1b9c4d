"""Merge the stacks of every rank into one prefix tree, STAT-style, and find the odd ones out.

Every thread's frames, outermost first, are inserted into a prefix tree; each node holds the set of
processes (shown as compact rank ranges: ``TP0-6,TP7``) and threads passing through it. Processes
whose main threads have the same stack form an equivalence class; among peers (ranked processes),
a class smaller than the largest one is the minority, highlighted as the odd ones out.

Frames are merged on (function, file), not line, so that ranks in the same function at different
lines stay together (the lines are kept in the node). Which frames count is ``stackframes``'; how the
processes are named, ``stackranks``'.

Pure functions over model objects: 10,000 rank stacks merge in well under a second (identical
stacks are grouped first and inserted once).
"""

from __future__ import annotations

from collections.abc import Collection
from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field

from hangwatch.analyse.stackframes import memo
from hangwatch.analyse.stackframes import signature
from hangwatch.analyse.stackframes import significant
from hangwatch.analyse.stackframes import significant_frames
from hangwatch.analyse.stackframes import wait_point
from hangwatch.analyse.stackranks import peer_pids
from hangwatch.analyse.stackranks import rank_label
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import ProcessStacks
from hangwatch.model.stacks import StackClass
from hangwatch.model.stacks import StackNode
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import StackTree
from hangwatch.model.stacks import ThreadStack
from hangwatch.model.stacks import paused_gc
from hangwatch.ranges import HostLists
from hangwatch.ranges import node_runs
from hangwatch.ranges import split_label
from hangwatch.ranges import split_node
from hangwatch.ranges import stems_text

FrameKey = tuple[str, str, bool]


@dataclass
class _Proc:
    """A process of the latest sample, indexed in rank-label order (so ranges are linear scans)."""

    stacks: ProcessStacks
    label: str
    prefix: str  # the label's stem: ``rank`` of ``hwn2:rank3``
    number: int | None
    node: str  # the node a merge across nodes named in the label (``hwn2``), else ""
    member: tuple[int, str] | None  # (number, node), as node_runs reads it


@dataclass
class _Node:
    key: FrameKey
    lines: set[int] = field(default_factory=set)
    # The distinct stacks through it (an index into the tree's groups: the process index per thread of
    # each), and how many threads those are. A node's members are the union of its stacks' groups; nodes
    # passed by the same stacks share one computed member set, label and pids (``_freeze``).
    stacks: list[int] = field(default_factory=list)
    threads: int = 0
    ends: int = 0
    unchanged: int = 0
    children: dict[FrameKey, _Node] = field(default_factory=dict)


def build_tree(
    samples: Sequence[StackSample],
    highlight: Iterable[int] | None = None,
    still: Collection[tuple[int, int]] | None = None,
) -> StackTree:
    """Merge the latest sample; earlier samples say which threads did not move.

    ``highlight``: pids to mark as the odd ones out (a rule's culprits); by default the minority class.
    ``still``: ``unchanged_threads(samples)``, where it was worked out already (the merge across nodes
    does, node by node, as the answers arrive: a thread's captures are all on its node).
    """
    with paused_gc:  # a node per frame and a label per member set, none in a cycle (model/stacks.py)
        return _build_tree(samples, highlight, still)


def _build_tree(
    samples: Sequence[StackSample],
    highlight: Iterable[int] | None,
    still: Collection[tuple[int, int]] | None,
) -> StackTree:
    if not samples:
        return StackTree((), (), 0, 0, 0, "no stacks were taken")
    latest = samples[-1]
    procs = _indexed(latest.dumped)
    peers = peer_pids(p.stacks for p in procs)
    if still is None:
        still = unchanged_threads(samples)
    # Identical stacks are one tuple object (memo): group by identity, insert each distinct stack once.
    paths: dict[int, tuple[tuple[Frame, ...], list[tuple[int, bool]]]] = {}
    merged: dict[int, tuple[Frame, ...]] = {}  # id of a thread's frames -> its significant frames
    threads = 0
    for index, proc in enumerate(procs):
        pid = proc.stacks.pid
        threads += len(proc.stacks.threads)
        for thread in proc.stacks.threads:
            frames = merged.get(id(thread.frames))
            if frames is None:
                frames = merged[id(thread.frames)] = significant_frames(thread)
            entry = paths.get(id(frames))
            if entry is None:
                entry = paths[id(frames)] = (frames, [])
            entry[1].append((index, (pid, thread.tid) in still))
    root = _Node(("", "", False))
    groups: list[list[int]] = []
    for frames, members in paths.values():
        _insert(root, frames, members, len(groups))
        groups.append([i for i, _ in members])
    classes = _classes(procs, peers)
    marked = (
        set(highlight) if highlight is not None else {pid for c in classes if c.minority for pid in c.pids}
    )
    candidates = peers or {p.stacks.pid for p in procs}
    if len(marked & candidates) * 2 > len(candidates):
        marked = set()  # most of them are "culprits" (everyone stuck): there is no odd one out to show
    member_sets = _Members(procs, groups)
    roots = tuple(
        _freeze(child, marked, member_sets)
        for child in sorted(root.children.values(), key=lambda n: -n.threads)
    )
    problems = tuple(
        f"{rank_label(p)} {p.name} [{p.pid}]: {p.outcome.value}" + (f" ({p.detail})" if p.detail else "")
        for p in latest.processes
        if p.outcome is not DumpOutcome.OK
    )
    return StackTree(
        roots=roots,
        classes=classes,
        samples=len(samples),
        processes=len(procs),
        threads=threads,
        summary=summarise(classes, _peer_classes(classes, peers))
        if classes
        else "no process could be dumped",
        problems=problems,
    )


def unchanged_threads(samples: Sequence[StackSample]) -> set[tuple[int, int]]:
    """(pid, tid) of threads with the same Python stack, lines included, in every one of >= 2 samples."""
    if len(samples) < 2:
        return set()
    first: dict[tuple[int, int], ThreadStack] = {}  # each thread's first capture
    again: set[tuple[int, int]] = set()
    moved: set[tuple[int, int]] = set()
    # Whether two frames tuples have the same signature, once per pair: a thread still in place has the
    # same tuple in every capture (interned), and ranks in one wait share theirs.
    same: dict[tuple[int, int], bool] = {}
    for sample in samples:
        for p in sample.processes:
            if p.outcome is not DumpOutcome.OK:
                continue
            pid = p.pid
            for t in p.threads:
                key = (pid, t.tid)
                was = first.get(key)
                if was is None:
                    first[key] = t
                    continue
                again.add(key)
                if was.frames is t.frames or key in moved:
                    continue
                pair = (id(was.frames), id(t.frames))
                equal = same.get(pair)
                if equal is None:
                    equal = same[pair] = signature(was) == signature(t)
                if not equal:
                    moved.add(key)
    return again - moved


def equivalence_classes(processes: Iterable[ProcessStacks]) -> tuple[StackClass, ...]:
    """Processes grouped by their main thread's Python stack; peers' smaller classes are the minority."""
    indexed = _indexed(processes)
    return _classes(indexed, peer_pids(p.stacks for p in indexed))


def _classes(indexed: Sequence[_Proc], peer_set: set[int]) -> tuple[StackClass, ...]:
    groups: dict[tuple[tuple[str, str], ...], list[_Proc]] = {}
    wheres: dict[tuple[tuple[str, str], ...], str] = {}
    keys: dict[int, tuple[tuple[str, str], ...]] = {}  # id of a main thread's frames -> its class
    for proc in indexed:
        main = proc.stacks.main_thread
        if main is None:
            continue
        key = keys.get(id(main.frames))
        if key is None:
            key = keys[id(main.frames)] = memo(
                "class", main.frames, lambda frames: _class_key(significant(frames))
            )
        members = groups.get(key)
        if members is None:
            members = groups[key] = []
            wheres[key] = wait_point(main)
        members.append(proc)
    peer_sizes = [sum(1 for p in members if p.stacks.pid in peer_set) for members in groups.values()]
    largest = max(peer_sizes, default=0)
    classes = []
    for (group, members), peers in zip(groups.items(), peer_sizes, strict=True):
        classes.append(
            StackClass(
                label=_compact(members),
                pids=tuple(p.stacks.pid for p in members),
                where=wheres[group],
                minority=0 < peers < largest,
            )
        )
    # Peers first, the largest class first: "rank0-6 in all_reduce; rank7 in capture".
    classes.sort(key=lambda c: (-len(c.pids), c.label))
    return tuple(classes)


def _compact(procs: Sequence[_Proc]) -> str:
    """``compact_ranges`` of the processes' labels, from the prefix and number each was split into once."""
    by_stem: dict[str, list[tuple[int, str]]] = {}
    other: list[str] = []
    seen: set[str] = set()
    for p in procs:
        if p.label in seen:
            continue
        seen.add(p.label)
        if p.number is None:
            other.append(p.label)
        else:
            by_stem.setdefault(p.prefix, []).append((p.number, p.node))
    return stems_text(by_stem, other)


def _class_key(frames: tuple[Frame, ...]) -> tuple[tuple[str, str], ...]:
    """The Python frames, and the native calls below the innermost one: processes whose leaves differ
    (one in ``c10d::Work::wait``, one in ``sched_yield``) are not one class."""
    last_py = max((i for i, f in enumerate(frames) if not f.native), default=-1)
    python = tuple((f.name, f.file) for f in frames if not f.native)
    return python + tuple((f.name, f.file) for f in frames[last_py + 1 :] if f.native)


def summarise(classes: Sequence[StackClass], peers: Sequence[StackClass] = (), limit: int = 6) -> str:
    """``rank0-6 in all_reduce; rank7 in capture (odd one out)``: the ranks' classes when there are ranks."""
    shown = list(peers) if peers else list(classes)
    parts = [f"{c.label} in {c.where}" + (" (odd one out)" if c.minority else "") for c in shown[:limit]]
    hidden = len(classes) - min(len(shown), limit)
    if hidden > 0:
        parts.append(f"{hidden} other process{'es' if hidden > 1 else ''}")
    return "; ".join(parts)


def _peer_classes(classes: Sequence[StackClass], peers: set[int]) -> list[StackClass]:
    return [c for c in classes if peers and set(c.pids) <= peers] if len(peers) >= 2 else []


def _indexed(processes: Iterable[ProcessStacks]) -> list[_Proc]:
    procs = []
    for p in processes:
        label = rank_label(p)
        number: int | None
        node = ""
        if p.rank and p.rank.isascii() and p.rank.isdigit():  # "rank3": split_label's answer, no regex
            prefix, number = "rank", int(p.rank)
        else:
            prefix, number = split_label(label)
            if number is not None:
                node, prefix = split_node(prefix)
        procs.append(_Proc(p, label, prefix, number, node, None if number is None else (number, node)))
    # Each stem's numbers in order across nodes, as node_runs reads them.
    procs.sort(
        key=lambda x: (
            (x.number is None, x.prefix, x.number, x.node)
            if x.number is not None
            else (True, x.prefix, 0, "", x.stacks.pid)
        )
    )
    return procs


def _insert(root: _Node, frames: tuple[Frame, ...], members: list[tuple[int, bool]], group: int) -> None:
    node = root
    for f in frames:
        key = (f.name, f.file, f.native)
        child = node.children.get(key)
        if child is None:
            child = node.children[key] = _Node(key)
        child.stacks.append(group)  # a path descends: it passes each node once
        child.threads += len(members)
        if f.line:
            child.lines.add(f.line)
        node = child
    node.ends += len(members)
    node.unchanged += sum(1 for _, still in members if still)


class _Members:
    """The processes a tree node's stacks pass, labelled and listed once per distinct set of stacks."""

    def __init__(self, procs: Sequence[_Proc], groups: Sequence[list[int]]) -> None:
        self.procs = procs
        self.groups = groups
        self.hosts = HostLists(p.node for p in procs)  # read once for every label of the tree
        self._found: dict[tuple[int, ...], tuple[str, tuple[int, ...]]] = {}

    def of(self, stacks: list[int]) -> tuple[str, tuple[int, ...]]:
        """The label and pids of the processes of ``stacks`` (groups' indices)."""
        # A chain of frames that the same stacks pass shares one member set: sorted, labelled and listed
        # once, not once per frame (each a pass over every rank; docs/stacks.md, "Where the time goes").
        key = tuple(stacks)
        found = self._found.get(key)
        if found is None:
            unique = tuple(sorted({i for g in stacks for i in self.groups[g]}))
            pids = tuple(self.procs[i].stacks.pid for i in unique)
            found = self._found[key] = (_label(unique, self.procs, self.hosts), pids)
        return found


def _freeze(node: _Node, marked: set[int], members: _Members) -> StackNode:
    label, pids = members.of(node.stacks)
    children = tuple(
        _freeze(c, marked, members) for c in sorted(node.children.values(), key=lambda n: -n.threads)
    )
    return StackNode(
        name=node.key[0],
        file=node.key[1],
        native=node.key[2],
        lines=tuple(sorted(node.lines)),
        threads=node.threads,
        pids=pids,
        label=label,
        children=children,
        ends=node.ends,
        unchanged=node.unchanged,
        minority=bool(marked) and set(pids) <= marked,  # only odd ones out pass here: their own branch
    )


def _label(indices: tuple[int, ...], procs: Sequence[_Proc], hosts: HostLists) -> str:
    """``compact_ranges`` over process indices that are already in (stem, number, node) order: the numbered
    first, each stem's members one stretch handed to ``node_runs``; then the labels without a number."""
    end = len(indices)
    while end and procs[indices[end - 1]].member is None:
        end -= 1
    parts: list[str] = []
    start = 0
    while start < end:
        stem = procs[indices[start]].prefix
        stop = end
        if procs[indices[end - 1]].prefix != stem:  # several stems (TP and rank): this one's stretch
            stop = next(k for k in range(start, end) if procs[indices[k]].prefix != stem)
        members = [m for i in indices[start:stop] if (m := procs[i].member) is not None]
        parts.extend(node_runs(stem, members, hosts))
        start = stop
    return ",".join(parts + [procs[i].label for i in indices[end:]])
