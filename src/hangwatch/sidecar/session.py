"""``hangwatch watch``: one long watch over a server's tree, its reading served over HTTP.

The same read-only watch as ``attach`` (the same assessor, never a signal), but it never ends by itself:
a stall is a reading that stands until the tree progresses again, and the watch goes on. The moment a
stall is reached, its evidence (the report with the stacks, the GPU and the log that made it) is written
into the evidence folder, before an orchestrator acting on the failed probe restarts the pod.

The target is a pid, or the topmost process whose command line matches ``--match``; with a pattern and
no such process yet (the sidecar started before the server), it waits for one, the probes passing open
meanwhile. When the whole tree has ended, the last reading stays served until the sidecar is stopped.

Or the sidecar launches the tree itself (``hangwatch watch -- CMD``, a container's entrypoint): as ``run``
launches it (its own session, the guardian, the log kept), but a stall never stops it (the orchestrator
acts on the failed probe); the sidecar ends when the command does, with its status, and stops the tree
when it is itself stopped.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from hangwatch.analyse.health import HealthTracker
from hangwatch.attach import Attached
from hangwatch.attach import AttachOptions
from hangwatch.attach import attached_report
from hangwatch.attach import watching
from hangwatch.collect import procfs
from hangwatch.collect.nvml import NvmlGpuSource
from hangwatch.collect.proctree import matching_roots
from hangwatch.errors import UsageError
from hangwatch.model.health import Reading
from hangwatch.model.report import Verdict
from hangwatch.model.samples import Tick
from hangwatch.model.status import Status
from hangwatch.model.vocabulary import State
from hangwatch.redact import redact_argv
from hangwatch.render.json_report import write_report
from hangwatch.render.live import make_view
from hangwatch.sidecar.server import HealthBoard
from hangwatch.sidecar.server import HealthServer
from hangwatch.supervise.plan import WatchOptions
from hangwatch.supervise.plan import plan_for
from hangwatch.supervise.session import start_supervised
from hangwatch.supervise.signals import handling

# How many evidence files (stalls, dumps) one sidecar keeps: a tree that stalls and recovers all day must
# not fill the disk. The first ones are kept (the first stall is the one to read), and the latest.
EVIDENCE_KEPT = 20


@dataclass(frozen=True)
class SidecarOptions:
    watch: WatchOptions
    pid: int | None
    match: re.Pattern[str] | None
    host: str
    port: int
    log: Path | None
    evidence_dir: Path  # with a command: its run folder too (output.log, run.json)
    whole_machine: bool = False
    command: tuple[str, ...] = ()  # launch this, rather than watch a pid or a match
    cgroup: re.Pattern[str] | None = None  # the topmost process of a matching cgroup (a container's)
    grace: float = 10.0  # launched: how long the stop waits after SIGTERM before SIGKILL


class Sidecar:
    """The board the server reads, the tracker that fills it, and the stop every wait listens to."""

    def __init__(self, options: SidecarOptions) -> None:
        self.options = options
        self.board = HealthBoard()
        self.stop = threading.Event()
        target = (
            f"pid {options.pid}"
            if options.pid is not None
            else f"the process that {_selector(options)}"
            if options.match is not None or options.cgroup is not None
            else " ".join(redact_argv(options.command))[:200]
        )
        self.tracker = HealthTracker(target, options.watch.interval)
        self.evidence: list[Path] = []
        self.pid = 0  # the tree's root, once found
        self._gone = False

    def find_target(self) -> int | None:
        """The pid to watch; with a pattern, the first match, waited for (None: stopped while waiting)."""
        o = self.options
        if o.pid is not None:
            return o.pid
        said = False
        while not self.stop.is_set():
            roots = matching_roots(o.match, cgroup=o.cgroup)
            if roots:
                return _oldest(roots)
            self.board.set(self.tracker.waiting(f"no process {_selector(o)} yet"))
            if not said:
                print(f"hangwatch watch: waiting for a process that {_selector(o)}", flush=True)
                said = True
            self.stop.wait(o.watch.interval)
        return None

    def watch(self, pid: int) -> None:
        o = self.options
        log = o.log if o.log is not None and o.log.is_file() else None  # else its stdout's file, if one
        attach = AttachOptions(o.watch, pid, window=0.0, log=log, whole_machine=o.whole_machine)
        with watching(attach, continuous=True) as a:
            a.watch.view.event(f"watching pid {pid} ({a.plan.profile.name}), read-only, until stopped")
            self._follow(a, pid)

    def launch(self) -> int:
        """Launch the command and watch it until it ends (its exit status) or the sidecar is stopped (0)."""
        o = self.options
        w = o.watch
        plan = plan_for(w, o.command)
        o.evidence_dir.mkdir(parents=True, exist_ok=True)
        view = make_view(w.quiet)
        gpu = NvmlGpuSource()
        notes = list(plan.notes)
        try:
            run = start_supervised(
                o.command, plan, w, o.evidence_dir, view=view, gpu=gpu, adopt_orphans=True, watch_serving=True
            )
            notes.extend(run.kit.notes)
            try:
                self._follow(Attached(run.watch, plan, w, o.command, notes, mode="run"), run.launched.pid)
            finally:
                run.tear_down(gpu, o.grace)  # ours, whatever happened: the tree never outlives us
        finally:
            gpu.close()
            view.close()
        if self.stop.is_set():
            return 0
        ended = run.watch.recorder.processes.get(self.pid)
        code = ended.exit_code if ended is not None and ended.exit_code is not None else 1
        return code if code >= 0 else 128 - code  # a death by signal N: 128 + N, as a shell says it

    def _follow(self, a: Attached, pid: int) -> None:
        """Run the watch until the tree has ended or the sidecar is stopped, its reading on the board."""
        self.pid = pid
        self.tracker.target = f"pid {pid} ({' '.join(redact_argv(a.cmdline))[:200]})"
        a.watch.on_status = lambda tick, status: self._observe(a, tick, status)
        a.watch.stop_requested = self.stop
        a.watch.run(lambda v: self._gone, on_change=lambda v, t: self._changed(a, v, t))

    def _observe(self, a: Attached, tick: Tick, status: Status) -> None:
        spans = a.watch.assessor.phases.spans(tick.t)
        phases = tuple((s.name, (s.end if s.end is not None else tick.t) - s.start) for s in spans)
        health = self.tracker.observe(
            tick, status, phases=phases, captures=a.watch.captures, capture_s=a.watch.capture_s
        )
        self.board.set(health)
        if self.board.dump_asked():
            self.board.dumped(self._dump(a, tick.t, "dump"))
        # The tree has ended: the loop stops, and its last reading stays served.
        self._gone = not tick.processes and health.reading in (Reading.CRASHED, Reading.EXITED)

    def _changed(self, a: Attached, verdict: Verdict | None, t: float) -> bool:
        """A new verdict stands (None: the tree progresses again). A stall's evidence is written now, while
        the tree is still there to read; said in one line by the watch's own view."""
        if verdict is not None and verdict.state is State.STALLED:
            refined = a.watch.read_collectives(a.watch.name_kernels(verdict))
            self._dump(a, t, f"stall-{self.tracker.stalls}", refined)
        return False

    def _dump(self, a: Attached, t: float, name: str, verdict: Verdict | None = None) -> str:
        """The whole report as it stands, written to the evidence folder: its path, or why it was not."""
        if verdict is None:
            standing = self.board.get()
            verdict = standing.verdict if standing is not None else None
        if verdict is None:  # nothing decided: the watch's state so far, as a stop would say it
            verdict = a.watch.assessor.interrupted("a dump was asked for (hangwatch dump)")
        if len(self.evidence) >= EVIDENCE_KEPT:
            self.evidence.pop(EVIDENCE_KEPT // 2).unlink(missing_ok=True)
        path = self.options.evidence_dir / f"{name}-at-{t:.0f}s.json"
        try:
            self.options.evidence_dir.mkdir(parents=True, exist_ok=True)
            write_report(attached_report(a, verdict, self.pid), path)
        except OSError as exc:
            a.watch.view.event(f"{t:.1f}s could not write {path}: {exc.strerror or exc}")
            return f"could not write {path}: {exc.strerror or exc}"
        self.evidence.append(path)
        a.watch.view.event(f"{t:.1f}s {name} evidence written to {path}")
        return str(path)


def _selector(o: SidecarOptions) -> str:
    """``matches 'sglang'``, ``is in a cgroup matching 'cri-containerd-4f2a'``, or both, in words."""
    parts = [f"matches {o.match.pattern!r}"] if o.match is not None else []
    parts += [f"is in a cgroup matching {o.cgroup.pattern!r}"] if o.cgroup is not None else []
    return " and ".join(parts)


def _oldest(pids: list[int]) -> int:
    """Of several matching trees, the one started first (the server, not a later helper's tree)."""
    started = {p: s.starttime_ticks for p in pids if (s := procfs.read_stat(p)) is not None}
    return min(started, key=lambda p: (started[p], p)) if started else pids[0]


def run_sidecar(options: SidecarOptions) -> int:
    """Serve until stopped (SIGTERM, SIGINT, SIGHUP): 0 then; a launched command's own status when it
    ended by itself."""
    car = Sidecar(options)
    try:
        server = HealthServer(options.host, options.port, car.board)
    except OSError as exc:
        raise UsageError(
            f"--listen {options.host}:{options.port}: {exc.strerror or exc}",
            "Give another port (--listen HOST:PORT), or stop what listens there.",
        ) from None
    server.start()
    host, port = server.address
    print(
        f"hangwatch watch: serving http://{host}:{port}/ (startup, live, ready, verdict, metrics)", flush=True
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        car.stop.set()

    code = 0
    try:
        with handling(stop):
            if options.command:
                code = car.launch()  # the entrypoint's shape: it ends with the command
            else:
                pid = car.find_target()
                if pid is not None:
                    car.watch(pid)
                while not car.stop.wait(3600):  # the tree has ended: its last reading stays served
                    pass
    finally:
        server.close()
    print(f"hangwatch watch: stopped at {time.strftime('%H:%M:%S')}", file=sys.stderr, flush=True)
    return code
