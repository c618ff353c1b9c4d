"""Shared-memory segments under /dev/shm: whose they are, and removing them only when nobody can use them.

A tree killed with SIGKILL leaves its segments behind (``psm_*`` of Python's shared_memory and
vLLM's broadcast queue, ``nccl-*`` of NCCL, ``torch_*``): memory that stays taken, in a tmpfs that
is often small (failure-modes F7; people wipe /dev/shm by hand). A segment belongs to the tree
when a member maps it or holds it open *before* the tree is stopped; it is removed afterwards
only when no process at all (every process's /proc/PID/maps and fds are read again) maps or
holds it. Segments are never chosen by their names.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from hangwatch.collect import procfs
from hangwatch.model.cleanup import SegmentOutcome
from hangwatch.model.cleanup import ShmSegment

SHM_DIR = "/dev/shm/"  # noqa: S108 - the POSIX shared-memory tmpfs, not a temporary file


def segments_of(pids: Iterable[int], shm_dir: str = SHM_DIR) -> list[ShmSegment]:
    """The segments the processes map or hold open (read before they are stopped)."""
    holders: dict[str, set[int]] = {}
    for pid in pids:
        for path in _uses(pid, shm_dir):
            holders.setdefault(path, set()).add(pid)
    segments = []
    for path, pids_of in sorted(holders.items()):
        try:
            st = Path(path).stat()
        except OSError:
            continue  # already unlinked: it goes when its last user goes
        segments.append(ShmSegment(path, st.st_blocks * 512, st.st_size, tuple(sorted(pids_of))))
    return segments


def _uses(pid: int, shm_dir: str) -> set[str]:
    found: set[str] = set()
    mapped = procfs.mapped_paths(pid, shm_dir)
    if isinstance(mapped, set):
        found |= mapped
    targets = procfs.fd_targets(pid)
    if isinstance(targets, list):
        found |= {t.removesuffix(" (deleted)") for t in targets if t.startswith(shm_dir)}
    return found


def users_of(
    paths: set[str], shm_dir: str = SHM_DIR, born_after: int = 0
) -> tuple[dict[str, set[int]], dict[int, int]]:
    """Every process that maps or holds one of ``paths``: ({path: pids}, {uninspectable pid: uid}).

    Processes we may not inspect are listed only when they started after ``born_after`` (clock
    ticks since boot): one older than the tree cannot have inherited its segments.
    """
    users: dict[str, set[int]] = {p: set() for p in paths}
    hidden: dict[int, int] = {}
    me = os.getpid()
    for pid in procfs.list_pids():
        if pid == me:
            continue
        mapped = procfs.mapped_paths(pid, shm_dir)
        targets = procfs.fd_targets(pid)
        if isinstance(mapped, procfs.Denied) or isinstance(targets, procfs.Denied):
            uid = procfs.read_uid(pid)
            stat = procfs.read_stat(pid)
            if uid is not None and stat is not None and stat.starttime_ticks >= born_after:
                hidden[pid] = uid
        used = (mapped if isinstance(mapped, set) else set()) | {
            t.removesuffix(" (deleted)")
            for t in (targets if isinstance(targets, list) else [])
            if t.startswith(shm_dir)
        }
        for path in used & paths:
            users[path].add(pid)
    return users, hidden


def release(
    segments: Iterable[ShmSegment], tree_start: int = 0, shm_dir: str = SHM_DIR
) -> list[SegmentOutcome]:
    """Remove the segments nobody maps or holds any more; keep the others and say why.

    ``tree_start`` is the start time (clock ticks) of the tree's oldest member.
    """
    segments = list(segments)
    present = {s.path for s in segments if Path(s.path).exists()}
    users, hidden = users_of(present, shm_dir, tree_start) if present else ({}, {})
    outcomes = []
    for seg in segments:
        if seg.path not in present:
            outcomes.append(
                SegmentOutcome(seg.path, seg.allocated_bytes, "already gone", "removed by the tree itself")
            )
            continue
        if users.get(seg.path):
            pids = ", ".join(str(p) for p in sorted(users[seg.path]))
            outcomes.append(
                SegmentOutcome(seg.path, seg.allocated_bytes, "kept", f"still mapped or open by pid {pids}")
            )
            continue
        try:
            owner = Path(seg.path).stat().st_uid
        except OSError:
            outcomes.append(
                SegmentOutcome(seg.path, seg.allocated_bytes, "already gone", "removed while we looked")
            )
            continue
        # A process we may not inspect, younger than the tree, could use it if it runs as its owner
        # or as root (see docs/doctor.md, cleanup).
        unsure = sorted(pid for pid, uid in hidden.items() if uid in (owner, 0))
        if unsure:
            outcomes.append(
                SegmentOutcome(
                    seg.path,
                    seg.allocated_bytes,
                    "kept",
                    f"cannot verify: the maps of pid {', '.join(map(str, unsure[:5]))} are not readable",
                )
            )
            continue
        try:
            Path(seg.path).unlink()
        except FileNotFoundError:
            outcomes.append(
                SegmentOutcome(seg.path, seg.allocated_bytes, "already gone", "removed while we looked")
            )
            continue
        except OSError as exc:
            outcomes.append(
                SegmentOutcome(seg.path, seg.allocated_bytes, "kept", f"cannot remove: {exc.strerror}")
            )
            continue
        outcomes.append(
            SegmentOutcome(seg.path, seg.allocated_bytes, "removed", "no process maps or holds it")
        )
    return outcomes
