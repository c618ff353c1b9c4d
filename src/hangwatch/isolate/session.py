"""``hangwatch isolate``: the baseline, then one change at a time (then pairs), until one makes it boot.

The order, the budget and the stopping rule live here; one run is ``runner.run_once``; what the runs
add up to is ``conclude.conclude``. Each finished run is saved at once (``state``), so Ctrl-C or a
crash loses at most the run in progress, and ``--resume`` picks up from there.

Ctrl-C (or SIGTERM): during a run, ``run``'s own handler stops the watch and the tree is torn down as
``hangwatch run`` does it; between runs our handler notes it and nothing new starts. Either way the
report says what is known, and the exit code is 130.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import time
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path
from types import FrameType

from hangwatch.isolate.conclude import conclude
from hangwatch.isolate.plan import Candidate
from hangwatch.isolate.plan import applicable
from hangwatch.isolate.plan import order
from hangwatch.isolate.plan import pairs
from hangwatch.isolate.runner import probe_port
from hangwatch.isolate.runner import run_once
from hangwatch.isolate.state import IsolateState
from hangwatch.isolate.toggles import Applied
from hangwatch.model.isolate import BASELINE
from hangwatch.model.isolate import ISOLATE_SCHEMA
from hangwatch.model.isolate import IsolateReport
from hangwatch.model.isolate import RunResult
from hangwatch.model.isolate import Toggle
from hangwatch.model.isolate import TrialResult
from hangwatch.model.vocabulary import State
from hangwatch.redact import redact_argv
from hangwatch.render.isolate_progress import Progress
from hangwatch.supervise.plan import WatchOptions
from hangwatch.supervise.plan import plan_for
from hangwatch.supervise.signals import handling


@dataclass(frozen=True)
class IsolateOptions:
    command: tuple[str, ...]
    watch: WatchOptions  # each run's: the stall window, the timeout per trial, the readiness rule
    grace: float
    run_dir: Path
    repeat: int
    budget_s: float | None
    run_all: bool
    pairs: bool
    toggles: tuple[Toggle, ...]
    notes: tuple[str, ...] = ()


class Stop:
    """Ctrl-C or SIGTERM seen outside a run's own watch (which handles its own)."""

    def __init__(self) -> None:
        self.requested = False
        self.signum = signal.SIGINT
        self._passed_on = False

    def new_run(self) -> None:
        self._passed_on = False

    def pass_on(self) -> None:
        """Called from inside a run's watch: a signal that came while the run was being launched (our
        handler's, not the watch's) is sent again, once, so that the watch stops the run now."""
        if self.requested and not self._passed_on:
            self._passed_on = True
            os.kill(os.getpid(), self.signum)

    @contextmanager
    def installed(self) -> Iterator[None]:
        def handler(signum: int, frame: FrameType | None) -> None:
            self.requested = True
            self.signum = signal.Signals(signum)

        with handling(handler):
            yield


def trial_result(
    index: int, name: str, toggle: Toggle | None, applied: Applied, *, runs: list[RunResult], repeat: int
) -> TrialResult:
    verdicts = tuple(r.verdict for r in runs)
    failures = [r for r in runs if r.verdict.state is not State.READY]
    shown = failures[0] if failures else runs[0]
    notes = tuple(dict.fromkeys(n for r in runs for n in r.notes))
    return TrialResult(
        index=index,
        name=name,
        toggles=tuple(name.split("+")) if toggle is not None else (),
        why=(toggle.why or toggle.describe()) if toggle is not None else "the command as given",
        edits=toggle.edits if toggle is not None else (),
        command=redact_argv(applied.argv)
        + tuple(f"[env {k}={v}]" for k, v in applied.env_set)
        + tuple(f"[env -u {k}]" for k in applied.env_unset),
        verdict=shown.verdict,
        runs=verdicts,
        durations_s=tuple(r.duration_s for r in runs),
        run_dirs=tuple(r.run_dir for r in runs),
        booted=sum(1 for v in verdicts if v.state is State.READY),
        repeat=repeat,
        culprits=shown.culprits,
        overheads_s=tuple(r.overhead_s for r in runs),
        notes=notes,
    )


class Isolation:
    def __init__(self, options: IsolateOptions, state: IsolateState, progress: Progress) -> None:
        self.o = options
        self.state = state
        self.progress = progress
        self.stop = Stop()
        self.started = time.monotonic()
        self.deadline = self.started + options.budget_s if options.budget_s is not None else None
        self.port = probe_port(options.command, options.watch)
        self.interrupted = False
        self.budget_spent = False
        self.planned = 1
        self.notes: list[str] = list(options.notes)

    def left_s(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def label(self, index: int, name: str) -> str:
        """``trial 0 (baseline)``, ``trial 3 of 6 (graphs-off)``: the number the table and the run
        directory (trial-03) give it, of the changes planned."""
        if index == 0:
            return f"trial 0 ({name})"
        return f"trial {index} of {self.planned - 1} ({name})"

    def run_trial(self, index: int, toggle: Toggle | None, applied: Applied) -> TrialResult | None:
        """The trial's runs (finished ones reused from the state); None when none could run."""
        name = toggle.name if toggle is not None else BASELINE
        edits = toggle.edits if toggle is not None else ()
        runs = self.state.done(name, edits)
        label = self.label(index, name)
        if runs:
            self.progress.say(f"{label}: {len(runs)} run(s) reused from --resume")
        while len(runs) < self.o.repeat:
            if self.stop.requested:
                self.interrupted = True
                break
            left = self.left_s()
            watch = self.o.watch
            cut_by_budget = False
            if left is not None:
                if left <= 0:
                    self.budget_spent = True
                    break
                if watch.timeout is None or left < watch.timeout:
                    watch = replace(watch, timeout=max(left, 1.0))
                    cut_by_budget = True
            number = len(runs) + 1
            run_dir = self.o.run_dir / f"trial-{index:02d}"
            if self.o.repeat > 1:
                run_dir = run_dir / f"run-{number}"
            self.progress.start(
                label, number, self.o.repeat, toggle.describe() if toggle else "as given", left
            )
            self.stop.new_run()
            view = self.progress.view(label, self.stop.pass_on)
            run = run_once(applied, watch, run_dir, grace=self.o.grace, view=view, port=self.port)
            if run.verdict.state is State.INTERRUPTED:
                self.interrupted = True
                self.progress.say(f"{label}: interrupted; its tree is cleaned up")
                break
            if cut_by_budget and run.verdict.state is State.TIMEOUT:
                self.budget_spent = True
                self.progress.say(f"{label}: cut short by --budget; this run does not count")
                break
            runs.append(run)
            self.state.add(name, edits, run)
            self.progress.finished(label, number, self.o.repeat, run, self.left_s())
        if not runs:
            return None
        return trial_result(index, name, toggle, applied, runs=runs, repeat=self.o.repeat)

    def run(self) -> IsolateReport:
        with self.stop.installed():
            return self._run()

    def _run(self) -> IsolateReport:
        env = dict(os.environ)
        candidates, skipped = applicable(self.o.toggles, self.o.command, env)
        self.notes.extend(skipped)
        self.planned = 1 + len(candidates)
        base_applied = Applied(self.o.command, (), ())
        baseline = self.run_trial(0, None, base_applied)
        trials: list[TrialResult] = []
        stopped = ""
        ordered: tuple[Candidate, ...] = ()
        if baseline is None or self.interrupted or self.budget_spent:
            stopped = self._why_stopped() or "no baseline"
        elif baseline.all_booted and baseline.complete:
            stopped = "the baseline booted: nothing to isolate"
        else:
            by_name = {c.toggle.name: c for c in candidates}
            ordered = tuple(
                by_name[t.name] for t in order(tuple(c.toggle for c in candidates), baseline.verdict.cause)
            )
            stopped = self._trials(ordered, 1, trials)
            if not stopped and self.o.pairs:
                booted = {t.name for t in trials if t.all_booted}
                more = pairs(tuple(c.toggle for c in ordered), booted, self.o.command, env)
                self.planned += len(more)
                stopped = self._trials(more, 1 + len(ordered), trials)
                ordered += more
            stopped = stopped or "every trial ran"
        ran = {t.name for t in trials}
        not_run = tuple(c.toggle.name for c in (ordered or candidates) if c.toggle.name not in ran)
        conclusion = conclude(baseline, tuple(trials))
        return IsolateReport(
            schema=ISOLATE_SCHEMA,
            engine=plan_for(self.o.watch, self.o.command).profile.name,
            command=redact_argv(self.o.command),
            started_at=self.state.started_at,
            duration_s=round(time.monotonic() - self.started, 3),
            run_dir=str(self.o.run_dir),
            repeat=self.o.repeat,
            budget_s=self.o.budget_s,
            stopped=stopped,
            baseline=baseline,
            trials=tuple(trials),
            not_run=not_run,
            conclusion=conclusion,
            notes=tuple(self.notes),
            interrupted=self.interrupted,
        )

    def _why_stopped(self) -> str:
        if self.interrupted:
            return "interrupted"
        if self.budget_spent:
            return "budget spent"
        return ""

    def _trials(self, candidates: tuple[Candidate, ...], first: int, trials: list[TrialResult]) -> str:
        """Run ``candidates`` in order; the reason to stop early, or "" when all ran."""
        for offset, candidate in enumerate(candidates):
            result = self.run_trial(first + offset, candidate.toggle, candidate.applied)
            if result is not None:
                trials.append(result)
            why = self._why_stopped()
            if why:
                return why
            if result is not None and result.complete and result.all_booted and not self.o.run_all:
                return f"{result.name} made it boot ({result.booted} of {result.done}); --all tries the rest"
        return ""


def now_iso() -> str:
    return dt.datetime.now().astimezone().isoformat(timespec="seconds")


def run_isolate(options: IsolateOptions, state: IsolateState, say: Callable[[str], None]) -> IsolateReport:
    options.run_dir.mkdir(parents=True, exist_ok=True)
    if not state.started_at:
        state.started_at = now_iso()
    state.save()
    return Isolation(options, state, Progress(say)).run()
