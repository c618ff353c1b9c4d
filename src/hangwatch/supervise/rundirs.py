"""Rotation of the default run folders: keep the newest N under ``~/.local/state/hangwatch/runs/``.

Every ``hangwatch run`` (and ``demo``) without ``--run-dir`` makes a new folder there
(``<YYYYMMDD-HHMMSS>-<pid>``: ``output.log``, ``run.json``); nothing else ever removed them. Before a new
one is made, the oldest are removed so that the newest ``HANGWATCH_KEEP_RUNS`` (default 50, the new one
counted; 0 keeps them all) remain. A folder given with ``--run-dir`` is the user's: never pruned.

Only what is certainly hangwatch's own goes: a folder (not a symlink) directly in the base, named like
one of ours (``<stamp>-<pid>``, isolate's ``<stamp>-<pid>-isolate``), holding a file only hangwatch
writes there (``run.json``, ``output.log``, ``isolate-state.json``, or either of the first two in a
subfolder: bench's ``server-a/``, isolate's ``trial-NN/``). A folder whose run may still be going on is
kept whatever its age: any process it names (the pid in its name, the supervisor or the tree's root in
a ``run.json``) is alive. Pruning never fails a command: what could not be removed is a note.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

KEEP_RUNS_ENV = "HANGWATCH_KEEP_RUNS"
DEFAULT_KEEP_RUNS = 50

# 20260105-142233-4711, 20260105-142233-4711-isolate (isolate's default), ...-isolate-4712.
_RUN_NAME = re.compile(r"(?P<stamp>\d{8}-\d{6})-(?P<pid>\d+)(?:-isolate(?:-(?P<pid2>\d+))?)?")
# Files only hangwatch writes in a run folder (supervise/runrecord.py and session.py, isolate/state.py).
_MARKERS = ("run.json", "output.log", "isolate-state.json")
_SUB_MARKERS = ("run.json", "output.log")


@dataclass(frozen=True)
class Pruned:
    """What one pruning pass did: the folders removed, the old ones kept because their run may be
    alive, and what went wrong (one line each; never raised)."""

    removed: tuple[Path, ...] = ()
    kept_live: tuple[Path, ...] = ()
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class _RunFolder:
    path: Path
    stamp: str
    pids: tuple[int, ...]  # from its name


def keep_runs_setting(environ: Mapping[str, str] | None = None) -> tuple[int, str | None]:
    """How many run folders to keep (0: all), and a note when ``HANGWATCH_KEEP_RUNS`` is not usable (then
    every folder is kept: a typo must not delete runs)."""
    env = os.environ if environ is None else environ
    text = env.get(KEEP_RUNS_ENV)
    if text is None or not text.strip():
        return DEFAULT_KEEP_RUNS, None
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if value < 0:
        return 0, f"{KEEP_RUNS_ENV}={text!r} is not a whole number of 0 or more: keeping every run folder"
    return value, None


def prune_run_dirs(base: Path, keep: int, *, new: Path | None = None) -> Pruned:
    """Remove hangwatch's own run folders in ``base`` but the newest ``keep`` (by the time in their name);
    ``new``, the folder about to be made, counts as one of them and is never touched. ``keep`` 0: none
    removed."""
    if keep <= 0:
        return Pruned()
    try:
        folders = _run_folders(base, exclude=new)
    except OSError as exc:
        return Pruned(problems=(f"cannot list {base}: {exc.strerror or exc}",))
    slots = keep - 1 if new is not None else keep
    old = sorted(folders, key=lambda f: (f.stamp, f.pids), reverse=True)[max(slots, 0) :]
    removed: list[Path] = []
    kept_live: list[Path] = []
    problems: list[str] = []
    for folder in old:
        try:
            if _may_be_running(folder):
                kept_live.append(folder.path)
                continue
            # rmtree removes what is inside, and refuses a symlink given as the top; on Linux it works on
            # file descriptors (shutil.rmtree.avoids_symlink_attacks), so a link inside is removed, never
            # followed.
            shutil.rmtree(folder.path)
            removed.append(folder.path)
        except FileNotFoundError:
            continue  # another hangwatch starting at the same moment pruned it (or is pruning it) first
        except OSError as exc:
            problems.append(f"cannot remove {folder.path}: {exc.strerror or exc}")
    return Pruned(tuple(removed), tuple(kept_live), tuple(problems))


def _run_folders(base: Path, exclude: Path | None) -> list[_RunFolder]:
    found: list[_RunFolder] = []
    with os.scandir(base) as entries:
        for entry in entries:
            match = _RUN_NAME.fullmatch(entry.name)
            if match is None or (exclude is not None and entry.name == exclude.name):
                continue
            # Not a symlink: a link to a folder elsewhere is not a run folder of this base.
            if not entry.is_dir(follow_symlinks=False):
                continue
            path = Path(entry.path)
            if not _holds_a_marker(path):
                continue
            pids = tuple(int(p) for p in (match["pid"], match["pid2"]) if p is not None)
            found.append(_RunFolder(path, match["stamp"], pids))
    return found


def _is_regular_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _holds_a_marker(path: Path) -> bool:
    if any(_is_regular_file(path / name) for name in _MARKERS):
        return True
    try:
        with os.scandir(path) as entries:
            subfolders = [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return False
    return any(_is_regular_file(sub / name) for sub in subfolders for name in _SUB_MARKERS)


def _alive(pid: int) -> bool:
    if pid <= 0:  # kill(0, ...) and kill(-1, ...) address groups, not a process
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _recorded_pids(run_json: Path) -> tuple[int, ...]:
    """The supervisor's and the tree root's pids of a ``run.json``; none when it is unreadable."""
    if not _is_regular_file(run_json):
        return ()
    try:
        data = json.loads(run_json.read_text())
    except (OSError, ValueError):
        return ()
    if not isinstance(data, dict):
        return ()
    pids = []
    for key in ("supervisor_pid", "pid"):
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            pids.append(value)
    return tuple(pids)


def _may_be_running(folder: _RunFolder) -> bool:
    """Whether any process the folder names is alive. A reused pid keeps an old folder one more time:
    the safe side."""
    records = [folder.path / "run.json"]
    with os.scandir(folder.path) as entries:
        records += [Path(e.path) / "run.json" for e in entries if e.is_dir(follow_symlinks=False)]
    pids = set(folder.pids)
    for record in records:
        pids.update(_recorded_pids(record))
    return any(_alive(pid) for pid in pids)
