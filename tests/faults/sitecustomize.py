"""Fault injection for real engines, without editing their files (tests/faults on the server's PYTHONPATH).

Python imports the first ``sitecustomize`` on ``sys.path`` at start-up, in every interpreter of the tree
(multiprocessing's spawned children included: they inherit PYTHONPATH). This one reads ``HANGWATCH_FAULT``
and installs a ``sys.meta_path`` finder: once the named module has executed, the named function or method
is wrapped so that, in the selected processes only, its Nth call injects a fault. Then it chains to the
next sitecustomize (the files in ``HANGWATCH_EXTRA_SITECUSTOMIZE``, else the next ``sitecustomize.py`` on
sys.path), so that SGLang's CPU shims still load; or the shims, first on the path, run this file as one
of their HANGWATCH_EXTRA_SITECUSTOMIZE files (then this one chains to nothing).

    HANGWATCH_FAULT="kind=block;target=vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model;
                     who=title:VLLM::Worker_TP1;after=1"

Fields (``;``-separated ``key=value``; several faults separated by ``||``):

* ``kind``: ``block`` (``threading.Event().wait()`` forever), ``spin`` (a busy Python loop forever),
  ``sigkill``, ``sigstop`` (signal to itself), ``raise`` (``RuntimeError``), ``exit`` (``os._exit(3)``),
  ``trace`` (no fault: log the Nth call in each selected process; to check that a target runs there).
  Kinds no rule was written for, to try the rules on shapes beyond the five: ``sleep`` (a loop of
  0.2 s sleeps forever: a poll for a condition that never comes, every wait timed), ``pause`` (blocked
  in the kernel with no Python wait at all: ``read`` of a pipe whose write end this process holds),
  ``lock`` (the thread takes a ``threading.Lock`` it already holds: a self-deadlock), ``segv`` (a
  segmentation fault in native code: a read of address 0 through ctypes). Added 2026-12-04: ``exit0``
  (``os._exit(0)``: the process leaves cleanly, without a word) and ``retrylog`` (a retry loop that logs
  ``still waiting ... (attempt N, waited S s)`` to stderr every 2 s, forever: a wait that logs).
* ``target``: ``module:qualname`` (``pkg.mod:func`` or ``pkg.mod:Class.method``; staticmethods,
  classmethods and ``async def`` are kept as they are).
* ``who``: which processes, checked at call time (titles are set late, by setproctitle):
  ``title:GLOB`` (the process title: setproctitle's, else /proc/self/cmdline with NULs as spaces),
  ``cmdline:GLOB`` (the whole command line, NULs as spaces), ``env:NAME=VALUE``, ``any``;
  ``argv-has:GLOB`` / ``argv-lacks:GLOB``: the *server's* command line has, or lacks, an argument
  matching GLOB (``--enforce-eager``, ``--cuda-graph-backend-decode*``): a fault that depends on a flag,
  as a real engine bug does. The server is the nearest interpreter up the tree that was started as a
  program of its own, not as a multiprocessing child (ranks and schedulers run ``-c from
  multiprocessing.spawn ...``); each such interpreter passes its arguments on to its children in
  ``HANGWATCH_FAULT_SERVER_ARGV`` (so a supervisor above the server, with the same environment, is
  not taken for it).
  Several conditions joined by ``&`` must all hold.
* ``after``: fire on the Nth call in a selected process (default 1).
* ``armfile``: calls made before this file exists are not counted (the matrix creates it once the server
  is ready, so serving faults skip warm-up calls).
* ``delay``: seconds to sleep in the call before firing (default 0).

When a fault fires, one line goes to stderr (``hangwatch-fault: fired kind=... in pid ... title ...``),
with the wall time, so that the matrix can measure the time from the fault to the verdict.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import importlib.abc
import importlib.machinery
import inspect
import json
import os
import runpy
import signal
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Sequence
from types import ModuleType
from typing import Any

ENV = "HANGWATCH_FAULT"
SERVER_ARGV_ENV = "HANGWATCH_FAULT_SERVER_ARGV"
EXTRA_ENV = "HANGWATCH_EXTRA_SITECUSTOMIZE"
KINDS = (
    "block", "spin", "sigkill", "sigstop", "raise", "exit", "trace", "sleep", "pause", "lock", "segv",
    "exit0", "retrylog",
)  # fmt: skip
_HERE = os.path.dirname(os.path.abspath(__file__))


class InjectedFault(RuntimeError):
    """The exception a ``kind=raise`` fault raises."""


def _log(text: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"hangwatch-fault: {text}\n")
        sys.stderr.flush()


def process_title() -> str:
    """The title now: setproctitle's if it is loaded, else /proc/self/cmdline's first word."""
    mod = sys.modules.get("setproctitle")
    getter = getattr(mod, "getproctitle", None)
    if getter is not None:
        with contextlib.suppress(Exception):
            title = str(getter()).strip()
            if title:
                return title
    return _cmdline()


def _cmdline() -> str:
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return " ".join(sys.argv)
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def _argv() -> list[str]:
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return list(sys.argv)
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _multiprocessing_child(argv: list[str]) -> bool:
    """Started by multiprocessing (spawn, forkserver, its resource tracker), not as a program."""
    return any(a.startswith("from multiprocessing.") for a in argv)


def server_argv() -> list[str]:
    """The arguments of the server the tree was started as (its first interpreter's)."""
    with contextlib.suppress(ValueError):
        return list(json.loads(os.environ.get(SERVER_ARGV_ENV, "[]")))
    return []


class Fault:
    def __init__(self, spec: str) -> None:
        fields: dict[str, str] = {}
        for raw in spec.split(";"):
            part = raw.strip()
            if part:
                key, _, value = part.partition("=")
                fields[key.strip()] = value.strip()
        self.spec = spec
        self.kind = fields.get("kind", "")
        if self.kind not in KINDS:
            raise ValueError(f"{ENV}: kind={self.kind!r} is not one of {', '.join(KINDS)}")
        target = fields.get("target", "")
        self.module, _, self.qualname = target.partition(":")
        if not self.module or not self.qualname:
            raise ValueError(f"{ENV}: target={target!r} must be module:qualname")
        self.who = fields.get("who", "any")
        self.after = int(fields.get("after", "1"))
        self.armfile = fields.get("armfile") or None
        self.delay = float(fields.get("delay", "0"))
        self.calls = 0
        self.fired = False
        self.patched = False
        self._lock = threading.Lock()

    def selected(self) -> bool:
        for raw in self.who.split("&"):
            cond = raw.strip()
            if cond in ("", "any"):
                continue
            how, _, arg = cond.partition(":")
            if how == "title":
                if not fnmatch.fnmatchcase(process_title(), arg):
                    return False
            elif how == "cmdline":
                if not fnmatch.fnmatchcase(_cmdline(), arg):
                    return False
            elif how in ("argv-has", "argv-lacks"):
                found = any(fnmatch.fnmatchcase(a, arg) for a in server_argv())
                if found != (how == "argv-has"):
                    return False
            elif how == "env":
                name, _, value = arg.partition("=")
                if os.environ.get(name) != value:
                    return False
            else:
                raise ValueError(f"{ENV}: who={self.who!r}: unknown selector {how!r}")
        return True

    def should_fire(self) -> bool:
        """Count this call; True on the Nth counted call in a selected process."""
        if self.fired:
            return False
        if self.armfile is not None and not os.path.exists(self.armfile):
            return False
        if not self.selected():
            return False
        with self._lock:
            if self.fired:
                return False
            self.calls += 1
            if self.calls < self.after:
                return False
            self.fired = True
            return True

    def fire(self) -> None:
        if self.delay > 0:
            time.sleep(self.delay)
        _log(
            f"{'traced' if self.kind == 'trace' else 'fired'} kind={self.kind} "
            f"target={self.module}:{self.qualname} call={self.calls} "
            f"in pid {os.getpid()} title {process_title()[:100]!r} thread {threading.current_thread().name!r} "
            f"t={time.time():.3f}"
        )
        if self.kind == "block":
            threading.Event().wait()
        elif self.kind == "spin":
            n = 0
            while True:
                n += 1
        elif self.kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.kind == "sigstop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif self.kind == "raise":
            raise InjectedFault(f"hangwatch-fault: injected exception in {self.module}:{self.qualname}")
        elif self.kind == "exit":
            os._exit(3)
        elif self.kind == "sleep":
            while True:
                time.sleep(0.2)
        elif self.kind == "pause":
            read_end, _write_end = os.pipe()  # the write end stays open here: the read never ends
            os.read(read_end, 1)
        elif self.kind == "lock":
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()
        elif self.kind == "segv":
            import ctypes

            ctypes.string_at(0)
        elif self.kind == "exit0":
            os._exit(0)
        elif self.kind == "retrylog":
            attempt = 0
            while True:
                attempt += 1
                _log(f"still waiting for the peer at 127.0.0.1:9 (attempt {attempt}, waited {2 * attempt} s)")
                time.sleep(2.0)

    def wrap(self, func: Callable[..., Any]) -> Callable[..., Any]:
        fault = self
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                if fault.should_fire():
                    fault.fire()  # blocking here blocks the event loop, as a wedged handler would
                return await func(*args, **kwargs)

            return async_wrapper

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if fault.should_fire():
                fault.fire()
            return func(*args, **kwargs)

        return wrapper

    def patch(self, module: ModuleType) -> None:
        if self.patched:
            return
        *owner_path, name = self.qualname.split(".")
        owner: Any = module
        for part in owner_path:
            owner = getattr(owner, part)
        raw = owner.__dict__.get(name) if isinstance(owner, type) else None
        if isinstance(raw, staticmethod):
            setattr(owner, name, staticmethod(self.wrap(raw.__func__)))
        elif isinstance(raw, classmethod):
            setattr(owner, name, classmethod(self.wrap(raw.__func__)))
        else:
            setattr(owner, name, self.wrap(getattr(owner, name)))
        self.patched = True
        if os.environ.get("HANGWATCH_FAULT_VERBOSE") == "1":
            _log(f"armed {self.kind} on {self.module}:{self.qualname} in pid {os.getpid()}")


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, faults: list[Fault]) -> None:
        self._inner = inner
        self._faults = faults

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        for fault in self._faults:
            try:
                fault.patch(module)
            except Exception as exc:  # a wrong target must be loud, not a silently healthy run
                _log(f"cannot patch {fault.module}:{fault.qualname}: {exc!r}")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class FaultFinder(importlib.abc.MetaPathFinder):
    def __init__(self, faults: list[Fault]) -> None:
        self._by_module: dict[str, list[Fault]] = {}
        for fault in faults:
            self._by_module.setdefault(fault.module, []).append(fault)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        faults = self._by_module.get(fullname)
        if not faults:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, faults)
                return spec
        return None


def install(text: str) -> list[Fault]:
    faults = [Fault(spec) for spec in text.split("||") if spec.strip()]
    sys.meta_path.insert(0, FaultFinder(faults))
    for fault in faults:  # already imported (unlikely this early): patch now
        module = sys.modules.get(fault.module)
        if module is not None:
            fault.patch(module)
    return faults


def _chain() -> None:
    """Run the sitecustomize this one shadows: the files in HANGWATCH_EXTRA_SITECUSTOMIZE (os.pathsep-separated,
    this file excepted), else the next ``sitecustomize.py`` on sys.path.

    Not when this file is itself run by another sitecustomize (SGLang's CPU shims execute the files named
    in HANGWATCH_EXTRA_SITECUSTOMIZE, under another module name): that one is the chain's head.
    """
    if __name__ != "sitecustomize":
        return
    me = os.path.realpath(__file__)
    extra = [p for p in os.environ.get(EXTRA_ENV, "").split(os.pathsep) if p]
    candidates = [p for p in extra if os.path.realpath(p) != me]
    if not extra:
        for entry in sys.path:
            path = os.path.join(entry or ".", "sitecustomize.py")
            if os.path.isfile(path) and os.path.realpath(path) != me:
                candidates.append(path)
                break
    for n, path in enumerate(candidates):
        runpy.run_path(path, run_name=f"hangwatch_chained_sitecustomize_{n}")


def _main() -> None:
    text = os.environ.get(ENV, "")
    if text.strip():
        argv = _argv()
        if not _multiprocessing_child(argv):
            os.environ[SERVER_ARGV_ENV] = json.dumps(argv)
        try:
            install(text)
        except Exception as exc:
            _log(f"bad {ENV}: {exc}")
            raise
    _chain()


_main()
