"""Stop a process tree we own, safely and verifiably.

SIGTERM to every member (and the session's process group), SIGCONT so stopped members can act
on it, a grace period, then SIGKILL for what is left, reap, and check that nothing remains. Only
processes known to be members (pid and start time) or in the launched session are signalled:
never anything found by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from collections.abc import Iterable
from dataclasses import dataclass

from hangwatch.collect import procfs
from hangwatch.collect.nvml import GpuSource
from hangwatch.model.samples import GpuSample
from hangwatch.words import plural

Identity = tuple[int, int]


@dataclass(frozen=True)
class CleanupResult:
    terminated: tuple[int, ...]  # ended after SIGTERM
    killed: tuple[int, ...]  # needed SIGKILL
    remaining: tuple[int, ...]  # still there at the end (unkillable: D state in a driver)
    gpu_note: str | None = None

    def describe(self) -> str:
        parts = [f"stopped {plural(len(self.terminated) + len(self.killed), 'process')}"]
        if self.killed:
            parts.append(f"{len(self.killed)} needed SIGKILL")
        if self.remaining:
            parts.append(f"{len(self.remaining)} REMAIN: {', '.join(map(str, self.remaining))}")
        if self.gpu_note:
            parts.append(self.gpu_note)
        return "; ".join(parts)


def alive_members(
    identities: Iterable[Identity], session: int | None, follow_children: bool = False
) -> set[int]:
    """Live (not zombie) members: known identities, the session's processes, and with ``follow_children``
    the descendants of members (children forked after the tree was listed)."""
    wanted = set(identities)
    alive: set[int] = set()
    stats = []
    for pid in procfs.list_pids():
        stat = procfs.read_stat(pid)
        if stat is None or pid == os.getpid():
            continue
        stats.append(stat)
        if stat.state != "Z" and (
            stat.identity in wanted or (session is not None and stat.session == session)
        ):
            alive.add(pid)
    if follow_children:
        # Only live members count as parents: the pid of a member that died may belong to a stranger now.
        parents = set(alive)
        grew = True
        while grew:
            new = {s.pid for s in stats if s.ppid in parents and s.pid not in parents}
            grew = bool(new)
            parents |= new
            alive |= {s.pid for s in stats if s.pid in new and s.state != "Z"}
    return alive


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def stop_tree(
    identities: Iterable[Identity],
    session: int | None,
    reap: Callable[[Iterable[int]], dict[int, int]],
    grace_s: float = 10.0,
    kill_wait_s: float = 5.0,
    *,
    follow_children: bool = False,
) -> CleanupResult:
    identities = set(identities)
    first = alive_members(identities, session, follow_children)
    if session is not None:
        with contextlib.suppress(OSError):
            os.killpg(session, signal.SIGTERM)  # the session leader's group: members not sampled yet too
    _signal_all(first, signal.SIGTERM)
    _signal_all(first, signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
    signalled = set(first)
    follow = follow_children
    newcomers = (signalled, signal.SIGTERM)
    left = _wait_gone(identities, session, reap, grace_s, follow_children=follow, newcomers=newcomers)
    killed: set[int] = set()
    if left:
        killed = set(left)
        _signal_all(left, signal.SIGKILL)
        _signal_all(left, signal.SIGCONT)
        newcomers = (set(left), signal.SIGKILL)
        left = _wait_gone(identities, session, reap, kill_wait_s, follow_children=follow, newcomers=newcomers)
    reap(first | killed)
    return CleanupResult(
        terminated=tuple(sorted(first - killed)),
        killed=tuple(sorted(killed - left)),
        remaining=tuple(sorted(left)),
    )


def _wait_gone(
    identities: set[Identity],
    session: int | None,
    reap: Callable[[Iterable[int]], dict[int, int]],
    timeout: float,
    *,
    follow_children: bool = False,
    newcomers: tuple[set[int], int] | None = None,
) -> set[int]:
    deadline = time.monotonic() + timeout
    while True:
        alive = alive_members(identities, session, follow_children)
        reap([pid for pid, _ in identities] + list(alive))
        alive = alive_members(identities, session, follow_children)
        if not alive or time.monotonic() >= deadline:
            return alive
        if follow_children and newcomers is not None:
            # A member forked while dying: the new child is in the tree by parentage; signal it once.
            signalled, sig = newcomers
            new = alive - signalled
            _signal_all(new, sig)
            _signal_all(new, signal.SIGCONT)
            signalled |= new
        time.sleep(0.1)


def await_gpu_release(gpu: GpuSource, pids: set[int], timeout_s: float) -> GpuSample:
    """Read the GPUs until ``pids`` hold no memory or ``timeout_s`` passes; the last reading."""
    deadline = time.monotonic() + timeout_s
    sample = gpu.read()
    while not sample.unavailable and sample.memory_of(frozenset(pids)) > 0 and time.monotonic() < deadline:
        time.sleep(0.5)
        sample = gpu.read()
    return sample


def busy_without_process(sample: GpuSample) -> str | None:
    """GPUs busy with no process on them (a kernel left spinning), in words; None when there are none."""
    busy = [
        g
        for g in sample.gpus
        if (g.util_pct or 0) > 50 and not any(p.gpu_index == g.index for p in sample.processes)
    ]
    if not busy:
        return None
    names = ", ".join(f"GPU {g.index} at {g.util_pct:.0f} %" for g in busy)
    return f"{names} with no process: the GPU may be wedged and need a reset (hangwatch never resets GPUs)"


def wait_gpu_release(gpu: GpuSource, pids: set[int], timeout_s: float = 15.0) -> str | None:
    """Wait (bounded) until no GPU memory is held by ``pids``; say what is left, or a GPU busy with no
    process."""
    sample = await_gpu_release(gpu, pids, timeout_s)
    if sample.unavailable:
        return None
    held = sample.memory_of(frozenset(pids))
    if held:
        return f"GPU memory still held by the tree after {timeout_s:.0f} s: {held / 2**20:.0f} MiB"
    return busy_without_process(sample) or "GPU memory of the tree released"
