"""Merge the stacks of every rank into one prefix tree, STAT-style, and find the odd ones out.

Every thread's frames, outermost first, are inserted into a prefix tree; each node holds the set of
processes (shown as compact rank ranges: ``TP0-6,TP7``) and threads passing through it. Processes
whose main threads have the same stack form an equivalence class; among peers (ranked processes),
a class smaller than the largest one is the minority, highlighted as the odd ones out.

Frames are merged on (function, file), not line, so that ranks in the same function at different
lines stay together (the lines are kept in the node). Native frames that only say how the
interpreter got there (``??``, ``pybind11::``, ``_PyEval``) are dropped; native frames below the
innermost Python frame are kept: they name the wait (``c10d::Work::wait``).

Pure functions over model objects: 10,000 rank stacks merge in well under a second (identical
stacks are grouped first and inserted once).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import Any
from typing import TypeVar

from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import ProcessStacks
from hangwatch.model.stacks import StackClass
from hangwatch.model.stacks import StackNode
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import StackTree
from hangwatch.model.stacks import ThreadStack

_GLUE = re.compile(
    r"^(?:\?\?|0x[0-9a-f]+|_?Py[A-Z_]\w*|pybind11|thread_run$|start_thread$|clone3?$|__libc_|_start$)"
)
_TITLE_RANK = re.compile(r"(?:^|[_:.\-])(?:rank|r)[_-]?(\d+)$", re.IGNORECASE)
_NUMBERED = re.compile(r"^(.*?)(\d+)$")
_UNTITLED = re.compile(r"^(?:python[\d.]*|python\d?-\w+)$")

FrameKey = tuple[str, str, bool]
T = TypeVar("T")
_MEMO: dict[tuple[str, int], tuple[tuple[Frame, ...], Any]] = {}
_MEMO_LIMIT = 200_000
_STDLIB = frozenset(
    {
        "threading.py",
        "queue.py",
        "selectors.py",
        "socket.py",
        "subprocess.py",
        "socketserver.py",
        "ssl.py",
        "multiprocessing",
        "asyncio",
        "concurrent",
        "selectors",
        "contextlib.py",
    }
)


def rank_label(p: ProcessStacks) -> str:
    """How a process is named in rank ranges: ``TP1``, ``rank3``; else ``role[pid]``.

    The rank comes from the engine profile (``VLLM::Worker_TP1``, ``RANK=3``); for programs that set
    neither, a title ending in ``rank3`` or ``:r3`` names it (``gloo_rank3``, ``dead_peer:r3``).
    """
    if p.rank:
        return f"rank{p.rank}" if p.rank.isdigit() else p.rank
    m = _TITLE_RANK.search(p.name)
    if m:
        return f"rank{int(m.group(1))}"
    return f"{p.role or p.name}[{p.pid}]"


def is_peer(p: ProcessStacks) -> bool:
    """A rank: one of several processes doing the same job, whose stacks are compared."""
    return bool(p.rank) or _TITLE_RANK.search(p.name) is not None


def peer_pids(processes: Iterable[ProcessStacks]) -> set[int]:
    """The ranks; when nothing names a rank, the largest group (2 or more) sharing one process title.

    Titles cut to 15 bytes lose the rank (``sglang::scheduler_TP3`` is ``sglang::schedul`` in comm
    without setproctitle), but the ranks still share their title, and the launcher does not.
    """
    processes = list(processes)
    ranked = {p.pid for p in processes if is_peer(p)}
    if len(ranked) >= 2:
        return ranked
    by_name: dict[str, set[int]] = {}
    for p in processes:
        if not _UNTITLED.match(p.name):  # two untitled interpreters (a launcher, a tracker) are no ranks
            by_name.setdefault(p.name, set()).add(p.pid)
    largest = max(by_name.values(), key=len, default=set())
    return largest if len(largest) >= 2 else ranked


def memo(kind: str, frames: tuple[Frame, ...], compute: Callable[[tuple[Frame, ...]], T]) -> T:
    """``compute(frames)``, once per frames tuple object.

    Identical stacks share one tuple (the py-spy boundary interns them), so 10,000 ranks in the same
    all_reduce cost one computation. The cache holds the tuple itself, so its id cannot be reused while
    the entry lives; it is dropped whole when it grows past ``_MEMO_LIMIT``.
    """
    key = (kind, id(frames))
    hit = _MEMO.get(key)
    if hit is not None and hit[0] is frames:
        return hit[1]  # type: ignore[no-any-return]
    value = compute(frames)
    if len(_MEMO) >= _MEMO_LIMIT:
        _MEMO.clear()
    _MEMO[key] = (frames, value)
    return value


def significant_frames(thread: ThreadStack) -> tuple[Frame, ...]:
    """The frames worth merging and showing: Python frames, and native frames inside or below them."""
    return memo("significant", thread.frames, _significant)


def signature(thread: ThreadStack) -> tuple[tuple[str, str, int], ...]:
    """``ThreadStack.signature``, memoised: identity over time (Python frames and their lines)."""
    return memo("signature", thread.frames, lambda _: thread.signature())


def _significant(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    first_python = next((i for i, f in enumerate(frames) if not f.native), None)
    if first_python is None:
        return tuple(f for f in frames if not _GLUE.match(f.name))
    return tuple(f for f in frames[first_python:] if not (f.native and _GLUE.match(f.name)))


def is_stdlib(f: Frame) -> bool:
    """A frame of the standard library's waiting machinery (threading, queues, pipes, selectors)."""
    return f.file.split("/", 1)[0] in _STDLIB or f.file in _STDLIB


def wait_point(thread: ThreadStack) -> str:
    """Where a thread is, short: its innermost own frame, then what it waits in.

    ``all_reduce > c10d::Work::wait``; ``CudaGraphRunner.capture > Event.wait``;
    ``rank_main > Queue.get`` (the standard library's waiting machinery below is left out).
    """
    return memo("wait-point", thread.frames, lambda _: _wait_point(significant_frames(thread)))


def _wait_point(frames: tuple[Frame, ...]) -> str:
    python = [i for i, f in enumerate(frames) if not f.native]
    if not python:
        return frames[-1].name if frames else "?"
    leaf = python[-1]
    owner = next((i for i in reversed(python) if not is_stdlib(frames[i])), leaf)
    if owner == leaf:
        return frames[leaf].name + (f" > {frames[leaf + 1].name}" if leaf + 1 < len(frames) else "")
    below = next((i for i in python if i > owner), leaf)
    return f"{frames[owner].name} > {frames[below].name}"


def compact_ranges(labels: Iterable[str]) -> str:
    """``[TP0, TP1, TP2, TP4, rank1, main[7]]`` -> ``TP0-2,TP4,rank1,main[7]``."""
    numbered: dict[str, list[int]] = {}
    other: list[str] = []
    for label in dict.fromkeys(labels):
        m = _NUMBERED.match(label)
        if m and "[" not in label:
            numbered.setdefault(m.group(1), []).append(int(m.group(2)))
        else:
            other.append(label)
    parts: list[str] = []
    for prefix in sorted(numbered):
        parts.extend(_runs(prefix, sorted(numbered[prefix])))
    return ",".join(parts + sorted(other))


def _runs(prefix: str, numbers: list[int]) -> list[str]:
    out: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        out.append(f"{prefix}{start}" if start == prev else f"{prefix}{start}-{prev}")
        if n is not None:
            start = prev = n
    return out


@dataclass
class _Proc:
    """A process of the latest sample, indexed in rank-label order (so ranges are linear scans)."""

    stacks: ProcessStacks
    label: str
    prefix: str
    number: int | None


@dataclass
class _Node:
    key: FrameKey
    lines: set[int] = field(default_factory=set)
    members: list[int] = field(default_factory=list)  # process index per thread through it
    ends: int = 0
    unchanged: int = 0
    children: dict[FrameKey, _Node] = field(default_factory=dict)


def build_tree(samples: Sequence[StackSample], highlight: Iterable[int] | None = None) -> StackTree:
    """Merge the latest sample; earlier samples say which threads did not move.

    ``highlight``: pids to mark as the odd ones out (a rule's culprits); by default the minority class.
    """
    if not samples:
        return StackTree((), (), 0, 0, 0, "no stacks were taken")
    latest = samples[-1]
    procs = _indexed(latest.dumped)
    still = unchanged_threads(samples)
    # Identical stacks are one tuple object (memo): group by identity, insert each distinct stack once.
    paths: dict[int, tuple[tuple[Frame, ...], list[tuple[int, bool]]]] = {}
    threads = 0
    for index, proc in enumerate(procs):
        for thread in proc.stacks.threads:
            threads += 1
            frames = significant_frames(thread)
            entry = paths.get(id(frames))
            if entry is None:
                entry = paths[id(frames)] = (frames, [])
            entry[1].append((index, (proc.stacks.pid, thread.tid) in still))
    root = _Node(("", "", False))
    for frames, members in paths.values():
        _insert(root, frames, members)
    classes = _classes(procs)
    marked = (
        set(highlight) if highlight is not None else {pid for c in classes if c.minority for pid in c.pids}
    )
    candidates = peer_pids(p.stacks for p in procs) or {p.stacks.pid for p in procs}
    if len(marked & candidates) * 2 > len(candidates):
        marked = set()  # most of them are "culprits" (everyone stuck): there is no odd one out to show
    cache: dict[tuple[int, ...], str] = {}
    roots = tuple(
        _freeze(child, procs, marked, cache)
        for child in sorted(root.children.values(), key=lambda n: -len(n.members))
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
        summary=summarise(classes, _peer_classes(classes, procs))
        if classes
        else "no process could be dumped",
        problems=problems,
    )


def unchanged_threads(samples: Sequence[StackSample]) -> set[tuple[int, int]]:
    """(pid, tid) of threads with the same Python stack, lines included, in every one of >= 2 samples."""
    if len(samples) < 2:
        return set()
    seen: dict[tuple[int, int], tuple[tuple[str, str, int], ...] | None] = {}
    counts: dict[tuple[int, int], int] = {}
    for sample in samples:
        for p in sample.dumped:
            for t in p.threads:
                key = (p.pid, t.tid)
                sig = signature(t)
                if key not in seen:
                    seen[key] = sig
                elif seen[key] is not sig and seen[key] != sig:
                    seen[key] = None
                counts[key] = counts.get(key, 0) + 1
    return {k for k, sig in seen.items() if sig is not None and counts[k] >= 2}


def equivalence_classes(processes: Iterable[ProcessStacks]) -> tuple[StackClass, ...]:
    """Processes grouped by their main thread's Python stack; peers' smaller classes are the minority."""
    return _classes(_indexed(processes))


def _classes(indexed: Sequence[_Proc]) -> tuple[StackClass, ...]:
    groups: dict[tuple[tuple[str, str], ...], list[_Proc]] = {}
    wheres: dict[tuple[tuple[str, str], ...], str] = {}
    for proc in indexed:
        main = proc.stacks.main_thread
        if main is None:
            continue
        key = memo("class", main.frames, lambda frames: _class_key(memo("significant", frames, _significant)))
        groups.setdefault(key, []).append(proc)
        wheres.setdefault(key, wait_point(main))
    peer_set = peer_pids(p.stacks for p in indexed)
    peer_sizes = [sum(1 for p in members if p.stacks.pid in peer_set) for members in groups.values()]
    largest = max(peer_sizes, default=0)
    classes = []
    for (group, members), peers in zip(groups.items(), peer_sizes, strict=True):
        classes.append(
            StackClass(
                label=compact_ranges(p.label for p in members),
                pids=tuple(p.stacks.pid for p in members),
                where=wheres[group],
                minority=0 < peers < largest,
            )
        )
    # Peers first, the largest class first: "rank0-6 in all_reduce; rank7 in capture".
    classes.sort(key=lambda c: (-len(c.pids), c.label))
    return tuple(classes)


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


def _peer_classes(classes: Sequence[StackClass], procs: Sequence[_Proc]) -> list[StackClass]:
    peers = peer_pids(p.stacks for p in procs)
    return [c for c in classes if peers and set(c.pids) <= peers] if len(peers) >= 2 else []


def _indexed(processes: Iterable[ProcessStacks]) -> list[_Proc]:
    procs = []
    for p in processes:
        label = rank_label(p)
        m = _NUMBERED.match(label)
        number = int(m.group(2)) if m and "[" not in label else None
        procs.append(_Proc(p, label, m.group(1) if m and number is not None else label, number))
    procs.sort(key=lambda x: (x.number is None, x.prefix, x.number if x.number is not None else x.stacks.pid))
    return procs


def _insert(root: _Node, frames: tuple[Frame, ...], members: list[tuple[int, bool]]) -> None:
    indices = [i for i, _ in members]
    node = root
    for f in frames:
        key = (f.name, f.file, f.native)
        child = node.children.get(key)
        if child is None:
            child = node.children[key] = _Node(key)
        child.members.extend(indices)
        if f.line:
            child.lines.add(f.line)
        node = child
    node.ends += len(members)
    node.unchanged += sum(1 for _, still in members if still)


def _freeze(
    node: _Node, procs: Sequence[_Proc], marked: set[int], cache: dict[tuple[int, ...], str]
) -> StackNode:
    unique = tuple(sorted(set(node.members)))
    label = cache.get(unique)
    if label is None:
        label = cache[unique] = _label(unique, procs)
    pids = tuple(procs[i].stacks.pid for i in unique)
    children = tuple(
        _freeze(c, procs, marked, cache)
        for c in sorted(node.children.values(), key=lambda n: -len(n.members))
    )
    return StackNode(
        name=node.key[0],
        file=node.key[1],
        native=node.key[2],
        lines=tuple(sorted(node.lines)),
        threads=len(node.members),
        pids=pids,
        label=label,
        children=children,
        ends=node.ends,
        unchanged=node.unchanged,
        minority=bool(marked) and set(pids) <= marked,  # only odd ones out pass here: their own branch
    )


def _label(indices: tuple[int, ...], procs: Sequence[_Proc]) -> str:
    """Compact ranges over process indices that are already in (prefix, number) order: a linear scan."""
    parts: list[str] = []
    run_start: _Proc | None = None
    prev: _Proc | None = None
    for i in indices:
        p = procs[i]
        if (
            prev is not None
            and p.number is not None
            and prev.number is not None
            and p.prefix == prev.prefix
            and p.number == prev.number + 1
        ):
            prev = p
            continue
        if run_start is not None and prev is not None:
            parts.append(_run_text(run_start, prev))
        run_start = prev = p
    if run_start is not None and prev is not None:
        parts.append(_run_text(run_start, prev))
    return ",".join(parts)


def _run_text(start: _Proc, end: _Proc) -> str:
    if start is end or start.number is None or end.number is None:
        return start.label
    return f"{start.prefix}{start.number}-{end.number}"
