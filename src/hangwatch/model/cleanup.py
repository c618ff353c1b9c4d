"""What ``hangwatch cleanup`` planned and what it freed. Frozen values; nothing here does I/O."""

from __future__ import annotations

from dataclasses import dataclass

from hangwatch.model.samples import ProcessId
from hangwatch.model.samples import ProcState


@dataclass(frozen=True)
class Member:
    """A process of the named tree, as listed before anything was signalled."""

    pid: int
    start_ticks: int  # with pid, its identity: a reused pid is never signalled
    ppid: int
    session: int
    state: ProcState  # T for stopped, Z for a zombie
    title: str
    # No thread of it is left (procfs.Stat.exited): Z with threads still running is its main thread's
    # state only, and such a process is stopped like any other.
    ended: bool

    @property
    def identity(self) -> ProcessId:
        return ProcessId(self.pid, self.start_ticks)


@dataclass(frozen=True)
class ShmSegment:
    """A file under /dev/shm that a member of the tree maps or holds open."""

    path: str
    allocated_bytes: int  # memory it takes (tmpfs blocks), what removing it frees
    size_bytes: int  # its apparent size
    holders: tuple[int, ...]  # members that map it or hold it open


@dataclass(frozen=True)
class GpuHeld:
    gpu_index: int
    tree_bytes: int  # memory NVML attributes to the tree's pids
    used_bytes: int | None  # the GPU's whole used memory


@dataclass(frozen=True)
class CleanupPlan:
    target: str  # "pid 1234", "port 8000", "run /path"
    root_pid: int | None  # None when the root is gone (a run whose launcher died)
    session: int | None  # signalled as a whole when the root leads it
    members: tuple[Member, ...]  # live ones, zombies included (state Z)
    segments: tuple[ShmSegment, ...]
    gpu: tuple[GpuHeld, ...] = ()
    gpu_note: str | None = None  # NVML unavailable, or its pids cannot be matched
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class SegmentOutcome:
    path: str
    allocated_bytes: int
    action: str  # "removed", "already gone" (the tree removed it itself), "kept"
    reason: str = ""


@dataclass(frozen=True)
class GpuFreed:
    gpu_index: int
    tree_before: int
    tree_after: int
    used_before: int | None
    used_after: int | None


@dataclass(frozen=True)
class CleanupOutcome:
    plan: CleanupPlan
    terminated: tuple[int, ...]  # ended after SIGTERM
    killed: tuple[int, ...]  # needed SIGKILL
    remaining: tuple[int, ...]  # still alive: unkillable (D state in a driver)
    zombies: tuple[tuple[int, int], ...]  # (pid, parent) exited but not yet reaped by their parent
    gpu: tuple[GpuFreed, ...]
    gpu_note: str | None
    segments: tuple[SegmentOutcome, ...]
    seconds: float

    @property
    def shm_freed_bytes(self) -> int:
        return sum(s.allocated_bytes for s in self.segments if s.action == "removed")

    @property
    def exit_code(self) -> int:
        """0 clean; 1 done but the tree's GPU memory was not released in time; 3 processes remain.

        A zombie is not a failure: it has exited and holds nothing but its pid until its parent
        (outside the tree, or init) reaps it.
        """
        if self.remaining:
            return 3
        if any(g.tree_after for g in self.gpu):
            return 1
        return 0
