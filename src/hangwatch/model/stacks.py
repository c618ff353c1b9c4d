"""Stacks of the tree's processes, as py-spy dumped them, and the merged tree built from them.

One ``StackSample`` is one capture round over the whole tree (every process dumped concurrently).
A dump that could not be taken is still a ``ProcessStacks``, with the ``outcome`` saying why: a
stopped process that was skipped is evidence, a permission failure carries the fix.

Frames are stored outermost first (``<module>`` ... leaf), the order a prefix tree is built in;
py-spy prints them leaf first.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from typing import TypeVar

from hangwatch.model.kernelwaits import ProcessWaits
from hangwatch.model.lockfiles import LockFile
from hangwatch.model.samples import GpuActivity


class DumpOutcome(StrEnum):
    OK = "ok"
    STOPPED = (
        "stopped"  # state T/t: not dumped on purpose (a dump could leave it stopped, and it is evidence)
    )
    DENIED = "denied"  # no ptrace permission: ``detail`` carries the fix
    NOT_PYTHON = "not-python"  # py-spy found no Python interpreter in it (a shell, ninja, a C++ server)
    TIMEOUT = "timeout"  # the dumper missed its deadline and was killed
    GONE = "gone"  # the process ended before or during the dump
    NO_DUMPER = "no-dumper"  # py-spy is not installed
    FAILED = "failed"  # anything else py-spy reported (``detail``)


@dataclass(frozen=True)
class Frame:
    """One frame. Native frames (``--native``) come from shared libraries and have no line."""

    name: str  # "all_reduce", "Condition.wait", "c10d::Work::wait"
    file: str  # short filename: "torch/distributed/distributed_c10d.py", "libtorch_cpu.so"
    line: int = 0
    native: bool = False
    code: str | None = None  # the source line, for the innermost Python frame ("with lock_b:")

    @property
    def key(self) -> tuple[str, str]:
        """What two frames are merged on: the function, not the line (lines go into the node)."""
        return (self.name, self.file)

    def describe(self, line: bool = True) -> str:
        if self.native:
            return self.name
        return (
            f"{self.name} ({self.file}:{self.line})" if line and self.line else f"{self.name} ({self.file})"
        )


T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


class FrameCache:
    """The stack analysis's one cache, in parts dropped together: equal stacks interned to one tuple
    object (the py-spy boundary, the nodes codec), what the analysis computed once per such tuple, and
    what the py-spy boundary made of each distinct raw stack it read (``parsed``).

    Ranks waiting in the same collective have equal stacks; sharing the object lets the analysis compute
    each distinct stack once (10,000 ranks, a handful of distinct stacks). Computed values are keyed by
    the tuple's id and hold the tuple itself, so its id cannot be reused while the entry lives. Each part
    is emptied whole when it grows past its limit; ``reset`` empties both (tests start from nothing).
    """

    def __init__(self, intern_limit: int = 50_000, memo_limit: int = 200_000) -> None:
        self.intern_limit = intern_limit
        self.memo_limit = memo_limit
        self._interned: dict[tuple[tuple[str, str, int, bool, str | None], ...], tuple[Frame, ...]] = {}
        self._memo: dict[tuple[str, int], tuple[tuple[Frame, ...], Any]] = {}
        self._parsed: dict[Any, Any] = {}

    def intern(self, frames: Sequence[Frame]) -> tuple[Frame, ...]:
        """One tuple object for every equal stack, across processes and captures."""
        key = tuple((f.name, f.file, f.line, f.native, f.code) for f in frames)
        found = self._interned.get(key)
        if found is None:
            if len(self._interned) >= self.intern_limit:
                self._interned.clear()
                self._parsed.clear()  # it holds interned tuples: kept, they would no longer be shared
            found = self._interned.setdefault(key, tuple(frames))
        return found

    def memo(self, kind: str, frames: tuple[Frame, ...], compute: Callable[[tuple[Frame, ...]], T]) -> T:
        """``compute(frames)``, once per ``kind`` and frames tuple object."""
        key = (kind, id(frames))
        hit = self._memo.get(key)
        if hit is not None and hit[0] is frames:
            return hit[1]  # type: ignore[no-any-return]
        value = compute(frames)
        if len(self._memo) >= self.memo_limit:
            self._memo.clear()
        self._memo[key] = (frames, value)
        return value

    def parsed(self, raw: K, convert: Callable[[K], T]) -> T:
        """``convert(raw)``, once per distinct (hashable) raw stack: py-spy's frames as read, before they
        become ``Frame`` values. Bounded like the interned part, and dropped with it."""
        found = self._parsed.get(raw)
        if found is None:
            if len(self._parsed) >= self.intern_limit:
                self._parsed.clear()
            found = self._parsed[raw] = convert(raw)
        return found

    def reset(self) -> None:
        self._interned.clear()
        self._memo.clear()
        self._parsed.clear()

    @property
    def sizes(self) -> tuple[int, int]:
        """(interned stacks, computed values)."""
        return len(self._interned), len(self._memo)


FRAME_CACHE = FrameCache()


class PausedGc:
    """The cyclic garbage collector off for the length of an allocation-heavy pass, back on after the
    last of any overlapping ones (the fan-out decodes bundles from several threads).

    Decoding 1,000 bundles or merging 10,000 ranks allocates hundreds of thousands of frozen samples,
    none in a reference cycle, and each allocation burst set off collections that walked every object
    alive: the collector took two thirds of the decode and a third of the merge (docs/stacks.md,
    "Where the time goes"). A pass makes no cycles worth collecting early; what one leaves is collected
    once the collector is back on.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._was_on = False

    def __enter__(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._was_on = gc.isenabled()
                gc.disable()
            self._depth += 1

    def __exit__(self, *_: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._was_on:
                gc.enable()


paused_gc = PausedGc()


def replaced(value: T, **changes: object) -> T:
    """``dataclasses.replace`` for the plain frozen samples of this model (no ``__post_init__``, no slots,
    every field an ``__init__`` argument): their fields copied and ``changes`` set, without ``__init__``.

    ``replace`` looks up every field by name and sets each through ``object.__setattr__`` (3.6 us for a
    sample): a third of the merge of 10,000 ranks went into it (docs/stacks.md, "Where the time goes");
    this takes 0.7 us. Only for the passes that copy every rank's samples, and never for a class with a
    ``cached_property`` (the copy would keep the original's cached value).
    """
    copy = object.__new__(type(value))
    fields = copy.__dict__
    fields.update(value.__dict__)
    fields.update(changes)
    return copy


def intern_frames(frames: Sequence[Frame]) -> tuple[Frame, ...]:
    """``FRAME_CACHE.intern``: one tuple object for every equal stack."""
    return FRAME_CACHE.intern(frames)


@dataclass(frozen=True)
class ThreadStack:
    tid: int  # the OS thread id (equals the pid for the main thread)
    name: str | None  # Python's thread name: "MainThread", "worker-A"
    active: bool  # py-spy's judgement: on CPU, not idle in a wait
    owns_gil: bool
    frames: tuple[Frame, ...]  # outermost first

    @property
    def leaf(self) -> Frame | None:
        return self.frames[-1] if self.frames else None

    @property
    def python_frames(self) -> tuple[Frame, ...]:
        return tuple(f for f in self.frames if not f.native)

    def signature(self) -> tuple[tuple[str, str, int], ...]:
        """Identity over time: the Python frames with their lines (native frames vary with --native)."""
        return tuple((f.name, f.file, f.line) for f in self.frames if not f.native)


@dataclass(frozen=True)
class ProcessStacks:
    """One process in one capture round."""

    pid: int
    name: str
    role: str | None
    rank: str | None
    outcome: DumpOutcome
    threads: tuple[ThreadStack, ...] = ()
    state: str = ""  # /proc state letter when the dump was taken (or skipped)
    cpu_s: float | None = None  # CPU seconds at the dump: a stack that stays put while this rises spins
    native: bool = False  # the frames include native ones (--native worked)
    world_size: int | None = None  # WORLD_SIZE from its environment, when set
    elapsed_s: float = 0.0  # how long the dumper ran for this process
    detail: str | None = None  # why it failed, and how to fix it
    resumed: bool = False  # the dump left it stopped, and hangwatch sent SIGCONT
    # Where each thread waits in the kernel, read just before the dump, in the node's own numbering
    # (pid, tids, children, inodes): the merge across nodes moves the process's pid, never its waits, so
    # ``pid - kernel.pid`` is the shift from the node's numbering to the sample's (0 on one node).
    kernel: ProcessWaits | None = None
    stops: int = 0  # times this dump stopped the process's threads (py-spy's run, our unwinder's copy)

    @property
    def main_thread(self) -> ThreadStack | None:
        """The thread that stands for the process: the main thread, else the first one dumped."""
        for thread in self.threads:
            if thread.tid == self.pid:
                return thread
        named = [t for t in self.threads if t.name == "MainThread"]
        return named[0] if named else (self.threads[0] if self.threads else None)


@dataclass(frozen=True)
class StackSample:
    """One capture round over the tree."""

    t: float
    processes: tuple[ProcessStacks, ...]
    elapsed_s: float  # wall time of the whole round
    gpus: tuple[GpuActivity, ...] = ()
    gpm_unavailable: str | None = None
    # socket inode -> the Unix socket it is connected to (sock_diag), for who can wake a reader of one
    unix_peers: tuple[tuple[int, int], ...] = ()
    # socket inode -> the other end of its loopback TCP connection, both ends held by the tree
    tcp_peers: tuple[tuple[int, int], ...] = ()
    # file locks a member waits for or holds a file of (``MAJ:MIN:INODE``) -> a pid holding it (/proc/locks)
    lock_holders: tuple[tuple[str, int], ...] = ()
    # holders of those locks outside the tree: pid -> its command line (redacted, cut), for the words
    lock_owners: tuple[tuple[int, str], ...] = ()
    # lock files in the build and cache folders that no process holds (markers a killed build left)
    lock_files: tuple[LockFile, ...] = ()

    def process(self, pid: int) -> ProcessStacks | None:
        for p in self.processes:
            if p.pid == pid:
                return p
        return None

    @property
    def dumped(self) -> tuple[ProcessStacks, ...]:
        return tuple(p for p in self.processes if p.outcome is DumpOutcome.OK)


@dataclass(frozen=True)
class StackNode:
    """A frame of the merged tree and every thread that passes through it."""

    name: str
    file: str
    native: bool
    lines: tuple[int, ...]  # the lines seen at this frame, across threads
    threads: int  # how many threads pass through
    pids: tuple[int, ...]
    label: str  # the processes as compact rank ranges: "TP0-6", "rank0-1,launcher[812]"
    children: tuple[StackNode, ...] = ()
    ends: int = 0  # threads whose innermost frame is this one
    unchanged: int = 0  # of those, how many had the same stack in every sample
    minority: bool = False  # on the path of the odd ones out

    def describe(self, short: bool = False) -> str:
        """``all_reduce (torch/distributed/distributed_c10d.py:3252)``; ``short``: the file's base name."""
        if self.native:
            return self.name
        lines = ",".join(str(n) for n in self.lines[:3]) + ("..." if len(self.lines) > 3 else "")
        file = self.file.rsplit("/", 1)[-1] if short else self.file
        return f"{self.name} ({file}:{lines})" if lines else f"{self.name} ({file})"


@dataclass(frozen=True)
class StackClass:
    """Processes whose main threads have the same stack (an equivalence class)."""

    label: str  # "rank0-2"
    pids: tuple[int, ...]
    where: str  # the innermost frames, short: "all_reduce > c10d::Work::wait"
    minority: bool  # smaller than the largest class of its peers: the odd ones out


@dataclass(frozen=True)
class StackTree:
    roots: tuple[StackNode, ...]
    classes: tuple[StackClass, ...]
    samples: int
    processes: int
    threads: int
    summary: str  # "rank0-1 in all_reduce; rank2 in rank_busy_elsewhere"
    problems: tuple[str, ...] = ()  # processes not dumped and why
