"""Find lock files no process holds in the folders engines build and cache in (model/lockfiles.py says why).

A bounded walk: a few folders (the tree's own environment says where they are), a few levels deep, a
few thousand entries at most, never following a link; read at a stack capture, when the tree has gone
quiet. A file counts when its name says it is a lock (``lock``, ``*.lock``) and ``/proc/locks`` shows no
lock on its inode.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path

from hangwatch.collect import procfs
from hangwatch.model.doctor import CacheFolder
from hangwatch.model.lockfiles import LockFile

# What the tree's environment may set, read from its processes (only these variables, never the rest),
# besides the engines' own cache variables (``env_keys``).
ENV_KEYS = frozenset({"HOME", "XDG_CACHE_HOME", "TORCH_EXTENSIONS_DIR", "FLASHINFER_WORKSPACE_BASE"})
MAX_DEPTH = 4  # torch_extensions/py311_cu121/<extension>/lock is 2 below the folder
MAX_ENTRIES = 5000  # per walk: a cache folder of a million files is not read whole at every capture
MAX_FOUND = 8
# /proc/stat's boot time is whole seconds: a start time read from it may be a second early or late.
START_SLACK_S = 2.0


def env_keys(engines: Sequence[CacheFolder]) -> frozenset[str]:
    """The variables ``marker_dirs`` reads: ``ENV_KEYS`` and each engine's cache folder's."""
    return ENV_KEYS | {c.env_var for c in engines}


def marker_dirs(env: Mapping[str, str], engines: Sequence[CacheFolder]) -> list[Path]:
    """Where builds leave markers, as the tools resolve them from the environment of the tree;
    ``engines``: the engines' cache folders."""
    home = Path(env.get("HOME") or Path.home())
    xdg = Path(env.get("XDG_CACHE_HOME") or home / ".cache")
    return [
        Path(env.get("TORCH_EXTENSIONS_DIR") or xdg / "torch_extensions"),  # torch.utils.cpp_extension
        *(Path(env.get(c.env_var) or xdg / c.xdg_name) for c in engines),
        Path(env.get("FLASHINFER_WORKSPACE_BASE") or home) / ".cache" / "flashinfer",
    ]


def is_lock_name(name: str) -> bool:
    return name == "lock" or name.endswith(".lock")


def find_lock_files(
    dirs: Iterable[Path], locked: set[str], started_wall: float, now_wall: float | None = None
) -> tuple[LockFile, ...]:
    """The lock files under ``dirs`` whose ``MAJ:MIN:INODE`` is not in ``locked`` (/proc/locks' keys)."""
    now = time.time() if now_wall is None else now_wall
    found: list[LockFile] = []
    seen: set[str] = set()
    for top in dirs:
        budget = [MAX_ENTRIES]
        for path, st in _walk(top, MAX_DEPTH, budget):
            key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
            if key in locked or str(path) in seen:
                continue
            seen.add(str(path))
            found.append(
                LockFile(str(path), round(max(0.0, now - st.st_mtime), 1), st.st_mtime < started_wall)
            )
            if len(found) >= MAX_FOUND:
                return tuple(found)
    return tuple(found)


def _walk(folder: Path, depth: int, budget: list[int]) -> Iterable[tuple[Path, os.stat_result]]:
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        budget[0] -= 1
        if budget[0] < 0:
            return
        try:
            if entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                if depth > 0:
                    yield from _walk(Path(entry.path), depth - 1, budget)
            elif entry.is_file(follow_symlinks=False) and is_lock_name(entry.name):
                yield Path(entry.path), entry.stat(follow_symlinks=False)
        except OSError:
            continue


def lock_files_of(
    pids: Iterable[int], engines: Sequence[CacheFolder], root: Path = procfs.PROC
) -> tuple[LockFile, ...]:
    """The lock files no process holds in the folders the tree's environment names (its first readable
    process's: a launcher's children inherit it), each said to be older than the tree or not;
    ``engines``: the engines' cache folders (the registry's cache_folders())."""
    pids = list(pids)
    keys = env_keys(engines)
    # Each variable from the first member that shows it; a process title set with setproctitle (vLLM's,
    # SGLang's) overwrites the environment /proc shows, so hangwatch's own (which the tree it launched
    # inherits) fills in what none shows.
    env = {k: v for k, v in os.environ.items() if k in keys}
    shown: dict[str, str] = {}
    for pid in pids:
        for key, value in procfs.read_environ(pid, keys, root).items():
            shown.setdefault(key, value)
    env.update(shown)
    starts = [s for s in (procfs.started_wall(pid, root) for pid in pids) if s is not None]
    locked = {key for key, _ in procfs.read_locks(root)}
    return find_lock_files(marker_dirs(env, engines), locked, min(starts) if starts else time.time())
