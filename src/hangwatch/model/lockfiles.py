"""A lock file that no process holds: a marker a killed build left, which the next run waits on forever.

torch's C++/CUDA extension builds (``torch.utils.cpp_extension``, through ``FileBaton``) mark a build in
progress by creating ``<build dir>/lock`` and removing it when done; every other process polls for the
file to go away. A build killed half-way leaves the file, and every later load of that extension polls
forever (``time.sleep`` in ``FileBaton.wait``: a poll, never a wait nothing can end). No process has it
open or locked: the path is all there is, and deleting it is the fix. ``filelock.SoftFileLock`` works
the same way. Locks taken with ``flock``/``fcntl`` are not markers: the kernel drops them with their
holder, and a live holder is named from ``/proc/locks`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LockFile:
    """A lock file found in a cache folder, with nothing in ``/proc/locks`` on it."""

    path: str
    age_s: float  # since its last change (st_mtime): how long it has marked a build "in progress"
    before_start: bool  # changed before the watched tree's first process started: an earlier run's
