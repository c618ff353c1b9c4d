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

from hangwatch.collect.nvml import GpuSource
from hangwatch.model.samples import GpuSample
from hangwatch.model.samples import ProcessId
from hangwatch.supervise import membership
from hangwatch.words import human_bytes
from hangwatch.words import plural


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


def _members(
    identities: set[ProcessId],
    session: int | None,
    follow: bool,
    adopter: int | None,
    exclude: Iterable[int],
    *,
    alive_only: bool,
) -> dict[int, ProcessId]:
    found = membership.scan(
        identities,
        () if session is None else (session,),
        follow=follow,
        adopter=adopter,
        exclude={os.getpid(), *exclude},
    )
    if alive_only:
        found = membership.alive(found)
    return {pid: s.identity for pid, s in found.items()}


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


@dataclass
class _Sweep:
    """What one clean-up looks for, and whom it tells before it signals anyone (the guardian)."""

    identities: set[ProcessId]
    session: int | None
    reap: Callable[[Iterable[int]], dict[int, int]]
    follow: bool
    adopter: int | None
    exclude: frozenset[int]
    on_found: Callable[[set[ProcessId]], None] | None

    def members(self, alive_only: bool) -> dict[int, ProcessId]:
        return _members(
            self.identities, self.session, self.follow, self.adopter, self.exclude, alive_only=alive_only
        )

    def alive(self) -> set[int]:
        self.reap([pid for pid, _ in self.identities] + list(self.members(alive_only=False)))
        found = self.members(alive_only=True)
        if self.on_found is not None and found:
            # Told before they are signalled: if we die now, the guardian knows every one of them.
            self.on_found(set(found.values()))
        return set(found)


def stop_tree(
    identities: Iterable[ProcessId],
    session: int | None,
    reap: Callable[[Iterable[int]], dict[int, int]],
    grace_s: float = 10.0,
    kill_wait_s: float = 5.0,
    *,
    follow_children: bool = False,
    adopter: int | None = None,
    exclude: Iterable[int] = (),
    on_found: Callable[[set[ProcessId]], None] | None = None,
) -> CleanupResult:
    """SIGTERM every member, SIGKILL what is left after ``grace_s``. A member that appears meanwhile (a
    launcher re-spawning its children, crash diagnostics started on SIGTERM) is signalled too."""
    sweep = _Sweep(set(identities), session, reap, follow_children, adopter, frozenset(exclude), on_found)
    first = sweep.alive()
    if session is not None:
        with contextlib.suppress(OSError):
            os.killpg(session, signal.SIGTERM)  # the session leader's group: members not sampled yet too
    _signal_all(first, signal.SIGTERM)
    _signal_all(first, signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
    signalled = set(first)
    left = _wait_gone(sweep, grace_s, signalled, signal.SIGTERM)
    killed: set[int] = set()
    if left:
        killed = set(left)
        _signal_all(left, signal.SIGKILL)
        _signal_all(left, signal.SIGCONT)
        left = _wait_gone(sweep, kill_wait_s, killed, signal.SIGKILL)  # newcomers join ``killed``
    sweep.reap(signalled | killed)
    return CleanupResult(
        terminated=tuple(sorted(signalled - killed)),
        killed=tuple(sorted(killed - left)),
        remaining=tuple(sorted(left)),
    )


def _wait_gone(sweep: _Sweep, timeout: float, signalled: set[int], sig: int) -> set[int]:
    """Wait until no member is left; a newcomer (forked while its parent died) is sent ``sig`` once.
    ``signalled`` grows with the newcomers."""
    deadline = time.monotonic() + timeout
    while True:
        alive = sweep.alive()
        if not alive or time.monotonic() >= deadline:
            return alive
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


# NVML's utilisation is an average over its last sample period: a GPU whose kernel was killed a moment
# ago still reads 100 % for up to a second. Advice that can make someone reset a shared GPU rests on a
# reading that persists this long.
BUSY_PERSIST_S = 5.0


def persistently_busy(gpu: GpuSource, sample: GpuSample, persist_s: float = BUSY_PERSIST_S) -> str | None:
    """``busy_without_process`` of ``sample``, confirmed by readings over ``persist_s``; None when any
    reading in between says otherwise."""
    busy = busy_without_process(sample)
    deadline = time.monotonic() + persist_s
    while busy is not None and time.monotonic() < deadline:
        time.sleep(min(1.0, persist_s / 5))
        busy = busy_without_process(gpu.read())
    return None if busy is None else f"{busy}; it stayed so for {persist_s:.0f} s"


def wait_gpu_release(gpu: GpuSource, pids: set[int], timeout_s: float = 15.0) -> str | None:
    """Wait (bounded) until no GPU memory is held by ``pids``; say what is left, or a GPU busy with no
    process."""
    sample = await_gpu_release(gpu, pids, timeout_s)
    if sample.unavailable:
        return None
    held = sample.memory_of(frozenset(pids))
    if held:
        return f"GPU memory still held by the tree after {timeout_s:.0f} s: {human_bytes(held, 'MiB', 'MiB')}"
    return persistently_busy(gpu, sample) or "GPU memory of the tree released"
