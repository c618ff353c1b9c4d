"""``hangwatch cleanup``: find the one process tree a user names, stop it, and prove what was freed.

The tree is named, never guessed: a pid (that process, its descendants, and its session when it
leads one), the tree listening on a port (the topmost process holding the listening socket), or
a hangwatch run directory (its ``run.json``: root pid + start time + session). Processes are
identified by (pid, start time), so a pid reused by a stranger is never signalled, and nothing is
ever matched by name (TensorRT-LLM PR #16404 is what tree-kill by name does: it took down its
own host process). hangwatch itself and its ancestors are never part of a tree it stops.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

from hangwatch.collect import procfs
from hangwatch.collect.host import listeners
from hangwatch.collect.host import process_label
from hangwatch.collect.nvml import GpuSource
from hangwatch.collect.nvml import NvmlGpuSource
from hangwatch.collect.proctree import check_target
from hangwatch.errors import NoSuchProcess
from hangwatch.errors import UsageError
from hangwatch.model.cleanup import CleanupOutcome
from hangwatch.model.cleanup import CleanupPlan
from hangwatch.model.cleanup import GpuFreed
from hangwatch.model.cleanup import GpuHeld
from hangwatch.model.cleanup import Member
from hangwatch.model.samples import GpuSample
from hangwatch.model.samples import ProcessId
from hangwatch.render.cleanup_text import outcome_text
from hangwatch.render.cleanup_text import plan_text
from hangwatch.supervise import shm
from hangwatch.supervise import teardown
from hangwatch.supervise.runrecord import read_run_record

ZOMBIE_WAIT_S = 2.0


def _snapshot() -> dict[int, procfs.Stat]:
    stats = {}
    for pid in procfs.list_pids():
        stat = procfs.read_stat(pid)
        if stat is not None:
            stats[pid] = stat
    return stats


def _ancestors(pid: int, stats: dict[int, procfs.Stat]) -> set[int]:
    seen: set[int] = set()
    while pid in stats and pid not in seen and pid > 0:
        seen.add(pid)
        pid = stats[pid].ppid
    return seen


def tree_pids(root: int | None, session: int | None, stats: dict[int, procfs.Stat]) -> set[int]:
    """``root`` and its descendants (by parentage, from one snapshot), plus the members of ``session``."""
    found: set[int] = set()
    if root is not None and root in stats:
        found.add(root)
        children: dict[int, list[int]] = {}
        for s in stats.values():
            children.setdefault(s.ppid, []).append(s.pid)
        todo = [root]
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in found:
                    found.add(child)
                    todo.append(child)
    if session is not None:
        found |= {s.pid for s in stats.values() if s.session == session}
    # Never a kernel thread, whatever the parentage says (kthreadd's children, session 0).
    return {p for p in found if not (p in stats and stats[p].kernel_thread)}


def _members(pids: Iterable[int], stats: dict[int, procfs.Stat]) -> tuple[Member, ...]:
    return tuple(
        Member(s.pid, s.starttime_ticks, s.ppid, s.session, s.state, process_label(s.pid), s.exited)
        for s in sorted((stats[p] for p in pids if p in stats), key=lambda s: s.pid)
    )


def _gpu_held(sample: GpuSample, pids: set[int]) -> tuple[tuple[GpuHeld, ...], str | None]:
    if sample.unavailable:
        return (), f"GPU memory not checked: {sample.unavailable}"
    held = []
    for g in sample.gpus:
        tree = sum(p.used_bytes or 0 for p in sample.processes if p.gpu_index == g.index and p.pid in pids)
        held.append(GpuHeld(g.index, tree, g.mem_used_bytes))
    note = None
    if not any(h.tree_bytes for h in held) and not any(p.pid in pids for p in sample.processes):
        note = (
            "NVML lists no process of the tree (none on a GPU, or NVML sees another PID namespace): "
            "whole-GPU memory shown"
        )
    return tuple(held), note


class TreeGone(NoSuchProcess):
    """The named tree has no process left: for a run directory, that run is already clean."""


def _plan(
    target: str,
    *,
    root: int | None,
    session: int | None,
    stats: dict[int, procfs.Stat],
    gpu: GpuSource,
    notes: tuple[str, ...] = (),
) -> CleanupPlan:
    if root is not None:
        check_target(target, [root], stats=stats)  # pid 2 before its tree: kernel threads are never members
    pids = tree_pids(root, session, stats)
    if not pids:
        raise TreeGone(f"{target}: no process of that tree is left")
    # init, hangwatch and its ancestors, a kernel thread: never stopped (cleanup has no whole-machine flag).
    check_target(target, pids, stats=stats)
    members = _members(pids, stats)
    held, note = _gpu_held(gpu.read(), pids)
    return CleanupPlan(
        target,
        root if root in stats else None,
        session,
        members,
        tuple(shm.segments_of(pids)),
        held,
        note,
        notes,
    )


def plan_for_pid(pid: int, gpu: GpuSource) -> CleanupPlan:
    stats = _snapshot()
    if pid not in stats:
        raise NoSuchProcess(f"no process with PID {pid}")
    if stats[pid].exited:
        raise NoSuchProcess(
            f"PID {pid} has already exited (a zombie waiting for its parent {stats[pid].ppid})"
        )
    session = pid if stats[pid].session == pid else None
    return _plan(f"pid {pid}", root=pid, session=session, stats=stats, gpu=gpu)


def plan_for_port(port: int, gpu: GpuSource) -> CleanupPlan:
    holders = {pid for pid, _ in listeners(port)}
    if not holders:
        raise NoSuchProcess(
            f"no process (that hangwatch may look into) listens on port {port}",
            "Check with `ss -ltnp`; as another user, run hangwatch as root.",
        )
    stats = _snapshot()
    # The topmost holder: a server's workers may have inherited the listening socket.
    tops = sorted(p for p in holders if p in stats and not (_ancestors(stats[p].ppid, stats) & holders))
    if len(tops) != 1:
        raise UsageError(
            f"several process trees listen on port {port} (pids {', '.join(map(str, tops))})",
            "Name one with --pid.",
        )
    root = tops[0]
    session = root if stats[root].session == root else None
    notes = (f"pid {root} listens on port {port}",)
    return _plan(f"port {port}", root=root, session=session, stats=stats, gpu=gpu, notes=notes)


def plan_for_run(run_dir: Path, gpu: GpuSource) -> CleanupPlan:
    try:
        record = read_run_record(run_dir)
    except ValueError as exc:
        raise UsageError(f"--run {run_dir}: {exc}", "Name the tree with --pid or --port instead.") from None
    stats = _snapshot()
    root_stat = stats.get(record.pid)
    alive = root_stat is not None and root_stat.starttime_ticks == record.start_ticks
    notes = []
    if not alive:
        notes.append(
            f"the run's root (pid {record.pid}) is gone: stopping what is left of its session "
            f"{record.session}"
        )
    supervisor = stats.get(record.supervisor_pid)
    if supervisor is not None:
        notes.append(f"pid {record.supervisor_pid} may still be the hangwatch run supervising it")
    root = record.pid if alive else None
    return _plan(
        f"run {run_dir}", root=root, session=record.session, stats=stats, gpu=gpu, notes=tuple(notes)
    )


def execute(
    plan: CleanupPlan,
    gpu: GpuSource,
    grace_s: float = 10.0,
    kill_wait_s: float = 5.0,
    gpu_wait_s: float = 15.0,
) -> CleanupOutcome:
    """Stop the planned tree (SIGTERM, grace, SIGKILL; stopped ones too), then verify and free the rest."""
    started = time.monotonic()
    identities = {m.identity for m in plan.members if not m.ended}
    # Its own children are no business of ours to reap: the tree's parents (or init) do that.
    result = teardown.stop_tree(
        identities, plan.session, lambda _pids: {}, grace_s, kill_wait_s, follow_children=True
    )
    pids = {m.pid for m in plan.members}
    zombies = _wait_zombies({m.identity for m in plan.members}, ZOMBIE_WAIT_S)
    freed, note = _wait_gpu(plan, gpu, pids, gpu_wait_s)
    segments = shm.release(plan.segments, tree_start=min((m.start_ticks for m in plan.members), default=0))
    return CleanupOutcome(
        plan=plan,
        terminated=result.terminated,
        killed=result.killed,
        remaining=result.remaining,
        zombies=zombies,
        gpu=freed,
        gpu_note=note,
        segments=tuple(segments),
        seconds=time.monotonic() - started,
    )


def _wait_zombies(identities: set[ProcessId], timeout_s: float) -> tuple[tuple[int, int], ...]:
    """Members that exited but are not reaped yet, after giving their parents ``timeout_s`` to do it.

    Exited as ``Stat.exited`` says: a zombie main thread with other threads still running has not
    ended (its parent cannot reap it yet), and ``stop_tree`` already lists it among the remaining."""
    deadline = time.monotonic() + timeout_s
    while True:
        zombies = []
        for pid, start in identities:
            stat = procfs.read_stat(pid)
            if stat is not None and stat.starttime_ticks == start and stat.exited:
                zombies.append((pid, stat.ppid))
        if not zombies or time.monotonic() >= deadline:
            return tuple(sorted(zombies))
        time.sleep(0.1)


def _wait_gpu(
    plan: CleanupPlan, gpu: GpuSource, pids: set[int], timeout_s: float
) -> tuple[tuple[GpuFreed, ...], str | None]:
    if not plan.gpu:
        return (), plan.gpu_note
    sample = teardown.await_gpu_release(gpu, pids, timeout_s)
    after = {h.gpu_index: h for h in _gpu_held(sample, pids)[0]}
    freed = tuple(
        GpuFreed(
            h.gpu_index,
            h.tree_bytes,
            after[h.gpu_index].tree_bytes if h.gpu_index in after else 0,
            h.used_bytes,
            after[h.gpu_index].used_bytes if h.gpu_index in after else None,
        )
        for h in plan.gpu
    )
    note = plan.gpu_note
    if any(f.tree_after for f in freed):
        note = f"GPU memory still held by the tree's pids after {timeout_s:.0f} s"
    busy = teardown.persistently_busy(gpu, sample)
    if busy:
        note = ((note + "; ") if note else "") + busy
    return freed, note


def make_gpu_source() -> NvmlGpuSource:
    return NvmlGpuSource()


def run_cleanup(
    *,
    pid: int | None,
    port: int | None,
    run_dir: Path | None,
    dry_run: bool,
    grace_s: float,
    gpu_wait_s: float,
) -> int:
    """``hangwatch cleanup``: plan the stop of the one tree named (by pid, port or run directory), print the
    plan (``dry_run``) or carry it out and print what was freed; the exit code is the outcome's."""
    gpu = make_gpu_source()
    try:
        if pid is not None:
            plan = plan_for_pid(pid, gpu)
        elif port is not None:
            plan = plan_for_port(port, gpu)
        else:
            assert run_dir is not None  # the parser requires one of the three
            try:
                plan = plan_for_run(run_dir, gpu)
            except TreeGone:
                # A finished run (the usual case: hangwatch run cleans up after itself): nothing to do.
                print(f"hangwatch cleanup: run {run_dir}: already clean (no process of it is left)")
                return 0
        if dry_run:
            print(plan_text(plan, grace_s), flush=True)
            return 0
        outcome = execute(plan, gpu, grace_s=grace_s, gpu_wait_s=gpu_wait_s)
    finally:
        gpu.close()
    print(outcome_text(outcome), flush=True)
    return outcome.exit_code
