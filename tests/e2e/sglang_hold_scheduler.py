"""Hold SGLang's scheduler forever before it starts (a test fault, chained from sglang_shims/sitecustomize.py).

Named in ``HANGWATCH_EXTRA_SITECUSTOMIZE``, this runs at start-up in every process of the server. Once
``sglang.srt.managers.scheduler`` has executed, its ``run_scheduler_process`` (the target of each
scheduler process SGLang spawns) is replaced by a wrapper that prints one line to stderr and sleeps
forever. The launcher only passes the function to multiprocessing; only the spawned scheduler calls it,
so that is the only process held: before ``kill_itself_when_parent_died()`` (PR_SET_PDEATHSIG) and before
``setproctitle``, the way a scheduler stuck in its early start-up is.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

MODULE = "sglang.srt.managers.scheduler"
FUNCTION = "run_scheduler_process"
HELD_LINE = "hangwatch-test: scheduler held before run_scheduler_process, pid"


def _held(*args: Any, **kwargs: Any) -> None:
    sys.stderr.write(f"{HELD_LINE} {os.getpid()}\n")
    sys.stderr.flush()
    while True:
        time.sleep(3600)


# multiprocessing pickles the target by name: the spawned child must look up the original name (and, this
# hook running there too, find this wrapper under it).
_held.__module__ = MODULE
_held.__qualname__ = _held.__name__ = FUNCTION


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        setattr(module, FUNCTION, _held)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


# Imported by name (the test reads HELD_LINE), it installs nothing; executed by a sitecustomize, it does.
if __name__ != "sglang_hold_scheduler":
    sys.meta_path.insert(0, _Finder())
