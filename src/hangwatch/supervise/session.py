"""One supervised launch: launch a command, watch it until a verdict, tear it down, build the report.

``hangwatch run`` is one (run.py); ``isolate`` runs one per trial, ``bench --launch-a/-b`` one per server.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from hangwatch.analyse.assess import Assessor
from hangwatch.collect import flightrecorder
from hangwatch.collect import procfs
from hangwatch.collect.http_probe import Prober
from hangwatch.collect.logtail import PipeLog
from hangwatch.collect.logtail import tail_lines
from hangwatch.collect.nvml import NvmlGpuSource
from hangwatch.collect.oom import OomWitness
from hangwatch.collect.proctree import TreeSampler
from hangwatch.collect.versions import environment_versions
from hangwatch.engines import registry
from hangwatch.model.cleanup import SegmentOutcome
from hangwatch.model.history import LaunchHistory
from hangwatch.model.report import ProcessRecord
from hangwatch.model.report import Report
from hangwatch.model.report import Verdict
from hangwatch.model.vocabulary import State
from hangwatch.redact import redact_argv
from hangwatch.redact import scrub
from hangwatch.render.files import write_outputs
from hangwatch.render.live import View
from hangwatch.render.live import make_view
from hangwatch.render.text import RAW_LOG_NOTE
from hangwatch.render.text import verdict_text
from hangwatch.supervise import shm
from hangwatch.supervise import teardown
from hangwatch.supervise.clock import WatchClock
from hangwatch.supervise.history import auto_note
from hangwatch.supervise.history import launch_history
from hangwatch.supervise.history import record_history
from hangwatch.supervise.launcher import Launched
from hangwatch.supervise.launcher import become_subreaper
from hangwatch.supervise.launcher import launch
from hangwatch.supervise.launcher import reap
from hangwatch.supervise.plan import Plan
from hangwatch.supervise.plan import WatchOptions
from hangwatch.supervise.plan import plan_for
from hangwatch.supervise.plan import report_outputs
from hangwatch.supervise.runrecord import write_run_record
from hangwatch.supervise.signals import handling
from hangwatch.supervise.watch import StackKit
from hangwatch.supervise.watch import Watch
from hangwatch.supervise.watch import build_watch
from hangwatch.words import plural


@dataclass(frozen=True)
class RunOptions:
    watch: WatchOptions
    command: tuple[str, ...]
    until_ready: bool
    run_dir: Path
    grace: float
    # After a stall verdict, leave the tree running: report, go on watching, report again on a change
    # or a recovery; the tree is stopped only when it ends, or at Ctrl-C / SIGTERM (run --keep-running).
    keep_running: bool = False
    # Turn torch's Flight Recorder on for the tree (its variables, unless the user set them): a stall reads
    # each rank's last collectives (run --no-flight-recorder turns it off).
    flight_recorder: bool = True


def default_run_dir() -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "hangwatch" / "runs"
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return base / f"{stamp}-{os.getpid()}"


@contextmanager
def stop_on_signals(watch: Watch) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP end the loop in an orderly way, so that cleanup always runs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        watch.stopped_by = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        watch.stop_requested.set()

    with handling(handler):
        yield


@dataclass
class Supervised:
    """Everything one supervised launch holds, so that tear-down can release it in order.

    Shared by ``hangwatch run`` and the servers ``hangwatch bench --launch-a/-b`` starts.
    """

    launched: Launched
    sampler: TreeSampler
    log: PipeLog
    prober: Prober | None
    kit: StackKit
    assessor: Assessor
    watch: Watch
    shm_outcomes: tuple[SegmentOutcome, ...] = ()  # the tree's /dev/shm segments after tear-down
    subreaper: bool = False  # orphans of the tree are reparented to us: our children are its members
    at_verdict: dict[int, ProcessRecord] = dataclasses.field(default_factory=dict)  # before tear-down

    def tear_down(self, gpu: NvmlGpuSource, grace: float) -> tuple[teardown.CleanupResult, str | None]:
        """Whatever happened (a verdict, Ctrl-C, an error of ours), the tree does not outlive us."""
        self.watch.c.stop_threads()
        self.watch.note_libraries()  # what only the live tree shows, for the next steps
        known = self.sampler.identities() | self.launched.guardian_known
        # The engine's shared-memory segments, noted while the tree still maps them: SGLang leaves
        # sglang_loads_*.shm behind even after a clean SIGTERM, and a killed tree leaves more.
        alive = {pid for pid, _ in known}
        segments = shm.segments_of(alive)
        tree_start = min((start for _, start in known), default=0)
        self.launched.tell_guardian(known)
        result = teardown.stop_tree(
            known, self.launched.pid, reap, grace,
            follow_children=True,  # children forked, or sessions started, while the tree dies
            adopter=os.getpid() if self.subreaper else None,
            exclude={self.launched.guardian.pid},
            on_found=self.launched.tell_guardian,  # before any is signalled: if we die now, it finishes
        )  # fmt: skip
        pids = {pid for pid, _ in self.launched.guardian_known} | self.sampler.known_pids()
        gpu_note = teardown.wait_gpu_release(gpu, pids)
        self.shm_outcomes = tuple(shm.release(segments, tree_start=tree_start))
        self.at_verdict = dict(self.watch.recorder.processes)  # before the clean-up's exits
        self.watch.record_last()  # the exits the clean-up caused
        self.log.close()
        self.launched.release_guardian(clean=not result.remaining)
        self.sampler.close()
        self.kit.close()
        self.watch.c.close_gpm()
        return result, gpu_note


def start_supervised(
    command: tuple[str, ...],
    plan: Plan,
    w: WatchOptions,
    run_dir: Path,
    *,
    view: View,
    gpu: NvmlGpuSource,
    adopt_orphans: bool,
    watch_serving: bool,
    flight_recorder: bool = True,
) -> Supervised:
    """Launch ``command`` and set up its watch (not yet running); ``run.json`` goes to ``run_dir``.

    ``adopt_orphans``: become the subreaper, so that orphans of the tree are reparented to us and keep
    being watched; only right when a single tree is watched (with two, an adopted orphan could not be
    told apart). ``watch_serving``: after ready, read /metrics for the stall-while-serving rule.
    ``flight_recorder``: turn torch's Flight Recorder on for the tree, its dump pipes and dumps in the run
    folder (unless the user set its variables), so that a stall can read it.
    """
    subreaper = become_subreaper() if adopt_orphans else False
    clock = WatchClock()
    extra: dict[str, str] = {}
    if flight_recorder:
        folder = run_dir / "flight-recorder"
        folder.mkdir(parents=True, exist_ok=True)
        extra = flightrecorder.launch_environment(folder, os.environ)
    launched = launch(list(command), extra_env=extra)
    write_run_record(run_dir, launched.pid, redact_argv(command))  # for `cleanup --run`
    sampler = TreeSampler(
        [launched.pid],
        plan.profile.role_of,
        adopter=os.getpid() if subreaper else None,
        exclude=lambda: {launched.guardian.pid},
        reap=reap,
        reaped_status=reap.status_of,
        clock=clock,
    )
    log = PipeLog(launched.output_fd, run_dir / "output.log", echo=view.echo, clock=clock)
    oom = OomWitness([procfs.read_cgroup_path(os.getpid())])
    watch, kit = build_watch(
        plan, w, sampler=sampler, log=log, gpu=gpu, oom=oom, root_pids={launched.pid}, view=view,
        clock=clock, watch_serving=watch_serving,
    )  # fmt: skip
    watch.on_members = launched.tell_guardian
    view.event(
        f"supervising {plan.profile.name} command (pid {launched.pid}); log {log.path} ({RAW_LOG_NOTE}); "
        f"probe {plan.probe_url or 'none'}; stall after {stall_words(w)}"
    )
    return Supervised(launched, sampler, log, watch.c.prober, kit, watch.assessor, watch, subreaper=subreaper)


def with_history(
    w: WatchOptions, command: tuple[str, ...], engine: str, notes: list[str]
) -> tuple[LaunchHistory, WatchOptions]:
    """The history read before the launch, and the watch options with it: the live view shows each phase
    against its usual duration from the first tick, and --stall-after auto's windows hold from then on
    (this boot is not among them). Its notes are added to ``notes``."""
    past = launch_history(command, engine, auto=w.stall_auto)
    notes += past.notes
    w = dataclasses.replace(
        w, phase_windows=tuple((p.phase, p.window_s) for p in past.windows), phase_usual=past.usual
    )
    if w.stall_auto:
        notes.append(auto_note(past.windows, w.stall_after_s))
    return past, w


def stall_words(w: WatchOptions) -> str:
    """``60 s``; under --stall-after auto ``auto (weights 26 s, others 60 s)``."""
    if not w.stall_auto:
        return f"{w.stall_after_s:g} s"
    own = ", ".join(f"{phase} {s:g} s" for phase, s in w.phase_windows)
    return (
        f"auto ({own}, others {w.stall_after_s:g} s)"
        if own
        else f"auto ({w.stall_after_s:g} s: no history yet)"
    )


def with_environment(report: Report, command: tuple[str, ...], python: str | None = None) -> Report:
    """The report with what a bug template asks for: the versions of the command's environment (torch,
    the engines' packages, ...), and the last lines of its log (redacted). Read once, at the end: about
    50 ms."""
    tail = tail_lines(Path(report.log_path)) if report.log_path else ()
    return dataclasses.replace(
        report,
        environment=environment_versions(command, python=python, engines=registry.distributions()),
        log_tail=tuple(scrub(line) for line in tail),
    )


def with_cleanup(
    report: Report, at_verdict: dict[int, ProcessRecord], result: teardown.CleanupResult
) -> Report:
    """Each process with its state at the verdict (``verdict_state``) and what the clean-up did to it:
    the report's own ``state``/``exit_code`` are the last known (``gone``, ``-15`` after our SIGTERM)."""
    records = []
    for p in report.processes:
        before = at_verdict.get(p.pid)
        if before is None or before.state == "gone":  # first seen during the clean-up, or ended before
            records.append(dataclasses.replace(p, verdict_state=before.state if before else None))
            continue
        records.append(dataclasses.replace(p, verdict_state=before.state, cleanup=cleanup_outcome(p, result)))
    return dataclasses.replace(report, processes=tuple(records))


def cleanup_outcome(p: ProcessRecord, result: teardown.CleanupResult) -> str:
    """``SIGTERM: -15``, ``SIGKILL: -9``, ``REMAINS`` (alive after SIGKILL): how the clean-up ended it."""
    if p.pid in result.remaining:
        return "REMAINS after SIGKILL"
    sent = "SIGKILL" if p.pid in result.killed else "SIGTERM" if p.pid in result.terminated else None
    code = "" if p.exit_code is None else str(p.exit_code)
    if p.state != "gone":
        return f"{sent}: not seen ending" if sent else "not seen ending"
    if sent is None:
        return f"ended: {code or 'status unknown'}"
    return f"{sent}: {code or 'status unknown'}"


def shm_notes(outcomes: tuple[SegmentOutcome, ...]) -> list[str]:
    """One line for the segments removed, one per segment kept (and why)."""
    removed = [o for o in outcomes if o.action == "removed"]
    notes = []
    if removed:
        names = ", ".join(o.path.rsplit("/", 1)[-1] for o in removed[:4])
        more = f" and {len(removed) - 4} more" if len(removed) > 4 else ""
        notes.append(f"cleanup: removed {len(removed)} /dev/shm segment(s) the tree left: {names}{more}")
    notes += [f"cleanup: kept {o.path}: {o.reason}" for o in outcomes if o.action == "kept"]
    return notes


@dataclass(frozen=True)
class Supervision:
    """What one supervised launch ended with: its report, and what clean-up could not stop."""

    report: Report
    remaining: tuple[int, ...]
    # run --keep-running: when the verdict at the end is the stall already said in full, when it was said
    # (the end then says it in short); None otherwise.
    said_at: float | None = None


def supervise(options: RunOptions, view: View | None = None) -> Supervision:
    """``hangwatch run``'s launch, watch and tear-down, without printing the verdict (``isolate`` runs it
    once per trial, with a view of its own)."""
    w = options.watch
    plan = plan_for(w, options.command)
    options.run_dir.mkdir(parents=True, exist_ok=True)
    view = view if view is not None else make_view(w.quiet)
    notes = list(plan.notes)
    past, w = with_history(w, options.command, plan.profile.name, notes)
    gpu = NvmlGpuSource()
    if gpu.unavailable:
        notes.append(f"GPU: unavailable: {gpu.unavailable}")
    verdict: Verdict | None = None
    kept = KeptRunning()

    def until(v: Verdict) -> bool:
        if options.keep_running and v.state is State.STALLED:
            return False  # said, and watched on (kept.said): it may yet recover
        # Ready without --until-ready: keep serving (and watching) until it exits or we are stopped.
        return options.until_ready or v.state is not State.READY

    def said(v: Verdict | None, t: float) -> bool:
        if not options.keep_running:
            return False
        kept.observe(v, t)
        if v is not None and v.state is State.STALLED:
            # The verdict now, as it will read at the end, and the reports with it: a user who stops
            # hangwatch later, or reads the JSON meanwhile, has the diagnosis either way.
            now = run.watch.report(v, plan.profile.name, "run", redact_argv(options.command), tuple(notes))
            now = dataclasses.replace(
                now, tree_action=KEPT_NOW, last_progress_t=run.assessor.last_progress_t()
            )
            write_outputs(report_outputs(now, w))  # before it is said: whoever reads the block finds them
            view.block(verdict_text(now))
            return True
        return False

    try:
        run = start_supervised(
            options.command, plan, w, options.run_dir, view=view, gpu=gpu, adopt_orphans=True,
            watch_serving=not options.until_ready, flight_recorder=options.flight_recorder,
        )  # fmt: skip
        run.watch.final_words = "stopping the tree; the verdict follows"
        run.watch.kept_running = options.keep_running
        notes.extend(run.kit.notes)
        try:
            with stop_on_signals(run.watch):
                # A GPU that spins: its kernels named before the tear-down, while the tree is alive.
                verdict = run.watch.read_collectives(run.watch.name_kernels(run.watch.run(until, said)))
        finally:
            result, gpu_note = run.tear_down(gpu, options.grace)
    finally:
        gpu.close()
        view.close()
    if gpu_note:
        notes.append(gpu_note)
    notes.extend(shm_notes(run.shm_outcomes))
    if options.keep_running:
        verdict = kept.final(verdict)
        notes.extend(kept.history())
    report = run.watch.report(
        verdict, plan.profile.name, "run", redact_argv(options.command), tuple(notes), tree_alive=False
    )
    report = with_cleanup(with_environment(report, options.command), run.at_verdict, result)
    report = dataclasses.replace(
        report,
        last_progress_t=run.assessor.last_progress_t(),
        # The window in force at the end (a boot phase's own under --stall-after auto): the timeline draws it.
        stall_after_s=run.assessor.stall_window(),
        stall_windows=past.windows,
        tree_action=tree_action(verdict, result, options, kept),
    )
    report = record_history(report, options.command)  # this boot against its phase history, then added
    said_at = kept.standing_t if kept.standing is not None and verdict is kept.standing else None
    return Supervision(report, tuple(result.remaining), said_at)


KEPT_NOW = (
    "left running (--keep-running): hangwatch goes on watching and reports again on a change; Ctrl-C stops it"
)


@dataclass
class KeptRunning:
    """``run --keep-running``: the stalls said while the tree was left running, and the recoveries."""

    standing: Verdict | None = None  # the stall in force (None: none, or it recovered)
    standing_t: float = 0.0
    events: list[str] = dataclasses.field(default_factory=list)

    def observe(self, v: Verdict | None, t: float) -> None:
        if v is None:
            if self.standing is not None:
                after = t - self.standing_t
                self.events.append(f"progressed again at {t:.1f} s, {after:.0f} s after the stall")
            self.standing = None
        elif v.state is State.STALLED:
            self.standing, self.standing_t = v, t
            cause = v.cause.value if v.cause else "no cause"
            self.events.append(f"stalled at {t:.1f} s ({cause}), kept running")

    def final(self, verdict: Verdict) -> Verdict:
        """The verdict at the end: a stall still in force when the user stopped us is the verdict (its
        exit code too), not "interrupted"; one the tree recovered from is history (the notes)."""
        if self.standing is not None and verdict.state is State.INTERRUPTED:
            return self.standing
        return verdict

    def history(self) -> list[str]:
        return [f"--keep-running: {e}" for e in self.events]


def tree_action(
    verdict: Verdict, result: teardown.CleanupResult, options: RunOptions, kept: KeptRunning
) -> str:
    """What hangwatch did to the tree, in one line of the verdict: the user who would rather have kept
    it (a boot that might still finish) reads here that it is gone, and how to keep it next time."""
    ended = _ended(result)
    if kept.standing is not None and verdict is kept.standing:
        at = kept.standing_t
        return f"left running after the stall at {at:.1f} s (--keep-running) until hangwatch stopped; {ended}"
    if verdict.state is State.STALLED:
        return (
            f"stopped by hangwatch at the verdict: {ended} (--keep-running leaves it running after a stall)"
        )
    if verdict.state is State.READY and options.until_ready:
        return f"stopped by hangwatch once ready (--until-ready): {ended}"
    if verdict.state is State.INTERRUPTED or verdict.state is State.READY:
        return f"stopped by hangwatch as it was stopped: {ended}"
    if not result.terminated and not result.killed and not result.remaining:
        return "nothing left to stop: the tree had ended"
    return f"the command ended; hangwatch stopped what it left: {ended}"


def _ended(result: teardown.CleanupResult) -> str:
    """``2 processes ended (1 needed SIGKILL)``, ``1 REMAINS: 412``: what the clean-up did."""
    parts = [f"{plural(len(result.terminated) + len(result.killed), 'process')} ended"]
    if result.killed:
        parts[0] += f" ({len(result.killed)} needed SIGKILL)"
    if result.remaining:
        parts.append(f"{len(result.remaining)} REMAIN: {', '.join(map(str, result.remaining))}")
    return "; ".join(parts)
