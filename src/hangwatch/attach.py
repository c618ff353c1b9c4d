"""``hangwatch attach``: the same watch over a tree someone else started. Read-only: no signals, ever.

The one exception is undoing our own side effect: stack dumps (py-spy, ptrace) pause a target for
milliseconds, and a process a dump left stopped is resumed with SIGCONT (collect/stacks.py); a process
that was stopped before is never dumped and never resumed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path

from hangwatch.collect import procfs
from hangwatch.collect.logtail import FileLog
from hangwatch.collect.nvml import NvmlGpuSource
from hangwatch.collect.oom import OomWitness
from hangwatch.collect.proctree import TreeSampler
from hangwatch.collect.proctree import check_target
from hangwatch.collect.proctree import own_processes
from hangwatch.errors import PTRACE_HELP
from hangwatch.errors import NoSuchProcess
from hangwatch.model.report import Report
from hangwatch.model.report import Verdict
from hangwatch.model.vocabulary import State
from hangwatch.redact import redact_argv
from hangwatch.render.live import make_view
from hangwatch.supervise.clock import WatchClock
from hangwatch.supervise.plan import Plan
from hangwatch.supervise.plan import WatchOptions
from hangwatch.supervise.plan import emit
from hangwatch.supervise.plan import plan_for
from hangwatch.supervise.session import stop_on_signals
from hangwatch.supervise.session import with_environment
from hangwatch.supervise.watch import Watch
from hangwatch.supervise.watch import build_watch


@dataclass(frozen=True)
class AttachOptions:
    watch: WatchOptions
    pid: int
    window: float
    log: Path | None
    whole_machine: bool = False


def find_log(pid: int) -> Path | None:
    """The file the process writes its stdout or stderr to, when that is a regular file."""
    for fd in (1, 2):
        target = procfs.fd_target(pid, fd)
        if target and target.startswith("/") and Path(target).is_file():
            return Path(target)
    return None


@dataclass
class Attached:
    """One read-only watch over a tree someone else started, wired and ready to run: what ``attach`` and
    the sidecar (``hangwatch watch``) share. Closed by ``watching``."""

    watch: Watch
    plan: Plan
    options: WatchOptions  # as applied: with attach's window
    cmdline: tuple[str, ...]
    notes: list[str]
    mode: str = "attach"  # the report's mode: "run" where the sidecar launched the tree itself


def _target_check(pid: int, whole_machine: bool) -> procfs.Stat:
    stat = procfs.read_stat(pid)
    if stat is None:
        raise NoSuchProcess(f"no process with PID {pid}")
    if stat.exited:
        raise NoSuchProcess(f"PID {pid} has already exited (it is a zombie waiting to be reaped)")
    # Not hangwatch itself or its parent chain (it would watch nothing but itself, left out, to a TIMEOUT),
    # not a kernel thread, not the whole machine unless asked for by name: as cleanup refuses them.
    check_target(f"--pid {pid}", [pid], whole_machine_flag="--whole-machine",
                 whole_machine=whole_machine, others_ok=True)  # fmt: skip
    return stat


@contextlib.contextmanager
def watching(options: AttachOptions, *, continuous: bool = False) -> Iterator[Attached]:
    """The watch over ``options.pid``'s tree, its collectors closed on the way out.

    ``continuous``: the sidecar's watch, which never ends by itself: no window, no timeout, and the
    engine's serving metrics read once it serves (read-only, as everything here)."""
    stat = _target_check(options.pid, options.whole_machine)
    cmdline = procfs.read_cmdline(options.pid) or (stat.comm,)
    # The window is the watch's end (analyse/assess.watch_policy); the sidecar's watch has none.
    w = options.watch if continuous else replace(options.watch, window_s=options.window)
    plan = plan_for(w, cmdline)
    notes = list(plan.notes)
    io = procfs.read_io(options.pid)
    if isinstance(io, procfs.Denied):
        notes.append(f"I/O counters unreadable: {io.reason}. {PTRACE_HELP}")
    log_path = options.log or find_log(options.pid)
    clock = WatchClock()
    # Followed in a thread, each line stamped as it is written: deaths are stamped the moment they
    # happen, and a kill and the exception it caused can come within one tick (collect/logtail.py).
    log = FileLog(log_path, clock=clock) if log_path is not None else None
    if log is None:
        notes.append("no log followed: the server's output is not a file; give --log FILE")
    gpu = NvmlGpuSource()
    if gpu.unavailable:
        notes.append(f"GPU: unavailable: {gpu.unavailable}")
    view = make_view(w.quiet)
    # Never watch ourselves: hangwatch and its helpers are left out of a tree that contains them.
    sampler = TreeSampler([options.pid], plan.profile.role_of, clock=clock, exclude=own_processes)
    oom = OomWitness([procfs.read_cgroup_path(options.pid)])
    watch, kit = build_watch(
        plan, w, sampler=sampler, log=log, gpu=gpu, oom=oom, root_pids={options.pid}, view=view,
        clock=clock, watch_serving=continuous,
    )  # fmt: skip
    notes.extend(kit.notes)
    try:
        yield Attached(watch, plan, w, cmdline, notes)
    finally:
        watch.c.stop_threads()
        if log is not None:
            log.close()
        sampler.close()
        kit.close()
        watch.c.close_gpm()
        gpu.close()
        view.close()


def attached_report(a: Attached, verdict: Verdict, pid: int) -> Report:
    """The report of an attached watch: the server's own interpreter read for its environment."""
    report = a.watch.report(verdict, a.plan.profile.name, a.mode, redact_argv(a.cmdline), tuple(a.notes))
    exe = None
    with contextlib.suppress(OSError):
        exe = os.readlink(f"/proc/{pid}/exe")  # the server's own interpreter, not ours on PATH
    python = exe if exe and Path(exe).name.startswith("python") else None
    report = with_environment(report, a.cmdline, python=python)
    return dataclasses.replace(
        report, last_progress_t=a.watch.assessor.last_progress_t(), stall_after_s=a.options.stall_after_s
    )


def run_attached(options: AttachOptions) -> int:
    with watching(options) as a:
        a.watch.view.event(
            f"attached to pid {options.pid} ({a.plan.profile.name}); watching up to {options.window:g} s; "
            "read-only"
        )
        with stop_on_signals(a.watch):
            # A server found serving is watched on to the end of the window: a wedge may come.
            verdict: Verdict = a.watch.name_kernels(
                a.watch.run(lambda v: v.state is not State.READY or a.watch.assessor.window_over)
            )  # the kernels of a GPU that spins, with --kernel-names: the server is still there
            # The ranks' own record of their collectives, where they keep one (asked through its pipe:
            # a write the rank reads, no signal).
            verdict = a.watch.read_collectives(verdict)
        report = attached_report(a, verdict, options.pid)
    emit(report, a.options)
    return verdict.exit_code
