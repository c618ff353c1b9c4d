"""The facts of a boot's key that live on disk: the model's size, whether the compile caches were warm.

Read once, at the end of a supervised launch (supervise/history.py), and cheap: the checkpoint's index or
its top-level weight files (``host.checkpoint_size``), and at most ``CACHE_ENTRIES`` entries of each
compile cache's top folder. A reading that fails is "unknown" (None, cold), never an exception.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path

from hangwatch.collect.host import cache_dirs
from hangwatch.collect.host import checkpoint_size
from hangwatch.model.doctor import CacheFolder

# The caches a boot compiles into; the Hugging Face download cache is not one (a model already
# downloaded is the model's key, not a warm compile).
_NOT_COMPILE = ("Hugging Face cache",)
CACHE_ENTRIES = 256


def local_model(value: str | None) -> tuple[str | None, int | None]:
    """A model named by a local folder: its absolute path and weights' bytes; a hub id as it is, no size."""
    name = model_name(value)
    if name is None:
        return None, None
    try:
        return name, checkpoint_size(Path(name)).total_bytes if Path(name).is_dir() else None
    except OSError:
        return name, None


def model_name(value: str | None) -> str | None:
    """How the key names a model: a local folder by its absolute path, a hub id as it is (no size read:
    what a launch knows before it starts)."""
    if not value:
        return None
    path = Path(value).expanduser()
    try:
        return str(path.resolve()) if path.is_dir() else value
    except OSError:
        return value


def compile_caches_warm(env: Mapping[str, str], started_wall: float, engines: Sequence[CacheFolder]) -> bool:
    """Whether a compile cache held an entry from before ``started_wall`` (a Unix time): an entry last
    changed before the boot started was there when it started. Read at the end, after the boot wrote to
    the caches; an entry the boot changed does not count, so a first boot is cold. ``engines``: the
    engines' cache folders (the registry's cache_folders())."""
    for purpose, folder in cache_dirs(env, engines):
        if purpose in _NOT_COMPILE:
            continue
        try:
            with os.scandir(folder) as entries:
                for count, entry in enumerate(entries):
                    if count >= CACHE_ENTRIES:
                        break
                    if entry.stat(follow_symlinks=False).st_mtime < started_wall:
                        return True
        except OSError:
            continue
    return False
