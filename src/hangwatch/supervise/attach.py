"""``hangwatch attach``: the same watch over a tree someone else started. Read-only: no signals, ever.

The one exception is undoing our own side effect: stack dumps (py-spy, ptrace) pause a target for
milliseconds, and a process a dump left stopped is resumed with SIGCONT (collect/stacks.py); a process
that was stopped before is never dumped and never resumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path

from hangwatch.collect import procfs
from hangwatch.collect.logtail import FileLog
from hangwatch.collect.nvml import NvmlGpuSource
from hangwatch.collect.oom import OomWitness
from hangwatch.collect.proctree import TreeSampler
from hangwatch.errors import PTRACE_HELP
from hangwatch.errors import NoSuchProcess
from hangwatch.model.report import Verdict
from hangwatch.model.vocabulary import State
from hangwatch.redact import redact_argv
from hangwatch.render.live import make_view
from hangwatch.supervise.plan import WatchOptions
from hangwatch.supervise.plan import emit
from hangwatch.supervise.plan import make_assessor
from hangwatch.supervise.plan import make_prober
from hangwatch.supervise.plan import make_scanner
from hangwatch.supervise.plan import plan_for
from hangwatch.supervise.session import stop_on_signals
from hangwatch.supervise.watch import Collectors
from hangwatch.supervise.watch import Watch
from hangwatch.supervise.watch import stack_kit


@dataclass(frozen=True)
class AttachOptions:
    watch: WatchOptions
    pid: int
    window: float
    log: Path | None


def find_log(pid: int) -> Path | None:
    """The file the process writes its stdout or stderr to, when that is a regular file."""
    for fd in (1, 2):
        target = procfs.fd_target(pid, fd)
        if target and target.startswith("/") and Path(target).is_file():
            return Path(target)
    return None


def run_attached(options: AttachOptions) -> int:
    stat = procfs.read_stat(options.pid)
    if stat is None:
        raise NoSuchProcess(f"no process with PID {options.pid}")
    if stat.state == "Z":
        raise NoSuchProcess(f"PID {options.pid} has already exited (it is a zombie waiting to be reaped)")
    cmdline = procfs.read_cmdline(options.pid) or (stat.comm,)
    # The window is a timeout: still progressing when it ends is a 'timeout' verdict, with the evidence.
    w = replace(options.watch, timeout=min(options.window, options.watch.timeout or options.window))
    plan = plan_for(w, cmdline)
    notes = list(plan.notes)
    io = procfs.read_io(options.pid)
    if isinstance(io, procfs.Denied):
        notes.append(f"I/O counters unreadable: {io.reason}. {PTRACE_HELP}")
    log_path = options.log or find_log(options.pid)
    log = FileLog(log_path) if log_path is not None else None
    if log is None:
        notes.append("no log followed: the server's output is not a file; give --log FILE")
    gpu = NvmlGpuSource()
    if gpu.unavailable:
        notes.append(f"GPU: unavailable: {gpu.unavailable}")
    view = make_view(w.quiet)
    sampler = TreeSampler([options.pid], plan.profile.role_of)
    prober = make_prober(plan, w, 0.0)
    oom = OomWitness([procfs.read_cgroup_path(options.pid)])
    kit = stack_kit(w.stacks, gpu.unavailable is None)
    notes.extend(kit.notes)
    collectors = Collectors(sampler, log, prober, gpu, oom, kit.dumper, kit.gpm)
    assessor = make_assessor(plan, w, {options.pid}, kit.history)
    watch = Watch(collectors, make_scanner(plan, w, prober), assessor, view, w.interval, history=kit.history)
    if prober is not None:
        prober._clock = watch.elapsed
    view.event(
        f"attached to pid {options.pid} ({plan.profile.name}); watching up to {options.window:g} s; read-only"
    )
    try:
        with stop_on_signals(watch):
            verdict: Verdict = watch.run(lambda v: True)
    finally:
        if prober is not None:
            prober.stop()
        sampler.close()
        kit.close()
        gpu.close()
        view.close()
    if verdict.state is State.TIMEOUT:
        verdict = replace(verdict, summary=f"still progressing at the end of the {options.window:g} s window")
    report = watch.report(verdict, plan.profile.name, "attach", redact_argv(cmdline), tuple(notes))
    emit(report, w)
    return verdict.exit_code
