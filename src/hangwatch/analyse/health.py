"""The sidecar's reading of the tree, tick by tick, and what each orchestrator probe answers from it.

The reading is the assessor's own judgement (the same rules as ``attach``), kept rolling: a verdict
that stands (stalled, crashed) is the reading until the tree progresses again, when it turns back to
progressing and a recovery is counted. The probes only read it:

- startup   passes while the tree progresses or is ready; fails on a stall, a crash or an end (the
            rules' stall already waits out the window and says progressing on mixed evidence: a slow
            start-up is never failed);
- liveness  fails only on a stall while serving, or on a dead member; a stall before ready is the
            startup probe's (a liveness probe that failed a slow boot would restart it in a loop);
- readiness passes only while serving, nothing wedged, and the engine's own readiness answer green.

Startup and liveness fail open: when hangwatch itself has no current reading (no tree found yet, its
loop behind), they pass and say why, so that hangwatch's own trouble never restarts a healthy server.
Readiness fails closed: without a reading nobody can say it is ready, and failing it only holds traffic.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hangwatch.analyse.gpustate import gpu_state
from hangwatch.model.health import Health
from hangwatch.model.health import ProbeAnswer
from hangwatch.model.health import ProbeKind
from hangwatch.model.health import Reading
from hangwatch.model.report import Verdict
from hangwatch.model.samples import ProbeOutcome
from hangwatch.model.samples import Tick
from hangwatch.model.status import Status
from hangwatch.model.vocabulary import State

# A reading older than this many watch intervals is no reading: the loop is stuck or starved (a capture
# of a huge tree, a host out of CPU), and hangwatch says so rather than judge from old news. At least
# STALE_MIN_S: one slow tick (a native capture takes 2 s) is not trouble.
STALE_TICKS = 10
STALE_MIN_S = 15.0
# How much of a verdict's summary a probe's one line carries (the kubelet keeps probe output in events).
REASON_CHARS = 300

_READINGS = {
    State.STALLED: Reading.STALLED,
    State.CRASHED: Reading.CRASHED,
    State.EXITED: Reading.EXITED,
}


class HealthTracker:
    """Folds each tick's status into the sidecar's reading and its counters."""

    def __init__(self, target: str, interval_s: float, wall: Callable[[], float] = time.time) -> None:
        self.target = target
        self.interval_s = interval_s
        self.wall = wall
        self.stalls = 0
        self.recoveries = 0
        self.verdicts: dict[str, int] = {}
        self._reading = Reading.WAITING
        self._standing: Verdict | None = None
        self._ended: Verdict | None = None  # the tree is gone: this verdict stays
        self._probe: tuple[bool | None, str] = (None, "")
        self._quiet = 0.0  # the quiet spell the standing verdict was last seen in

    def waiting(self, problem: str) -> Health:
        """No tree yet (the server not started, or not matched yet): a reading that says so."""
        now = self.wall()
        return Health(
            Reading.WAITING, self.target, 0.0, now, self.interval_s, "waiting", 0.0, (), False, 0.0, None,
            "none yet", None, None, "", None, self.stalls, self.recoveries, tuple(self.verdicts.items()), 0,
            0.0, (), problem=problem,
        )  # fmt: skip

    def observe(
        self,
        tick: Tick,
        status: Status,
        *,
        phases: tuple[tuple[str, float], ...],
        captures: int = 0,
        capture_s: float = 0.0,
    ) -> Health:
        now = self.wall()
        self._fold(tick, status)
        if status.probe is not None:
            p = status.probe
            self._probe = (p.outcome is ProbeOutcome.HTTP and p.green, p.describe())
        standing = self._ended or self._standing
        ranks = {p.pid: p.rank for p in tick.processes}
        culprits = tuple(r for pid in (standing.culprits if standing else ()) if (r := ranks.get(pid)))
        return Health(
            reading=self._reading,
            target=self.target,
            t=tick.t,
            updated_wall=now,
            interval_s=self.interval_s,
            phase=status.phase,
            in_phase_s=status.in_phase_s,
            phases=phases,
            serving=status.serving,
            quiet_s=status.quiet_s,
            last_progress_wall=now - status.quiet_s if status.last_progress != "none yet" else None,
            last_progress=status.last_progress,
            time_to_stall_s=status.time_to_stall_s,
            probe_green=self._probe[0],
            probe_said=self._probe[1],
            verdict=standing,
            stalls=self.stalls,
            recoveries=self.recoveries,
            verdicts=tuple(sorted(self.verdicts.items())),
            captures=captures,
            capture_s=capture_s,
            culprit_ranks=tuple(dict.fromkeys(culprits)),
            gpus=_gpu_states(tick),
        )

    def _fold(self, tick: Tick, status: Status) -> None:
        if self._ended is not None:
            return
        v = status.verdict
        if v is not None and v.state in _READINGS:
            reading = _READINGS[v.state]
            if reading is not self._reading or self._standing is None:
                self._count(v)
                if reading is Reading.STALLED:
                    self.stalls += 1
            self._standing, self._reading, self._quiet = v, reading, status.quiet_s
            if not tick.processes and reading is not Reading.STALLED:
                self._ended = v  # nothing left to watch: the last word stays
            return
        if self._standing is not None and status.quiet_s >= self._quiet:
            # Not decided again this tick (a capture awaited), but nothing moved since: it stands.
            self._quiet = status.quiet_s
            return
        if v is not None and v.state is State.READY and self._reading is not Reading.READY:
            self._count(v)
        if self._reading is Reading.STALLED:
            self.recoveries += 1  # it moved again: a long GC, a late peer
        self._standing = None
        self._reading = Reading.READY if status.serving else Reading.PROGRESSING

    def _count(self, v: Verdict) -> None:
        self.verdicts[v.state.value] = self.verdicts.get(v.state.value, 0) + 1


def _gpu_states(tick: Tick) -> tuple[tuple[int, str, str], ...]:
    """The tree's GPUs judged as the rules judge them (GPM's pipes where read, else NVML's readings)."""
    gpu = tick.gpu
    if gpu is None or not gpu.gpus:
        return ()
    members = {p.pid for p in tick.processes}
    held = sorted({p.gpu_index for p in gpu.processes if p.pid in members})
    uuids = {g.index: g.uuid or "" for g in gpu.gpus}
    return tuple((i, uuids.get(i, ""), gpu_state(gpu, gpu.activity, {i})) for i in held if i in uuids)


def answer(kind: ProbeKind, health: Health | None, now_wall: float | None = None) -> ProbeAnswer:
    """What the probe ``kind`` answers from the latest reading."""
    now = time.time() if now_wall is None else now_wall
    trouble = _no_data(health, now)
    if trouble is not None:
        if kind is ProbeKind.READINESS:
            return ProbeAnswer(kind, False, f"not ready: {trouble}")
        return ProbeAnswer(kind, True, f"passing: {trouble}; hangwatch's own trouble never fails this probe")
    assert health is not None
    v = health.verdict
    said = v.headline[:REASON_CHARS] if v is not None else ""
    if kind is ProbeKind.READINESS:
        if health.reading is not Reading.READY:
            return ProbeAnswer(kind, False, f"not ready: {said or health.reading.value}")
        if health.probe_green is False:
            return ProbeAnswer(
                kind, False, f"not ready: the engine's readiness probe answers {health.probe_said}"
            )
        return ProbeAnswer(kind, True, f"ready: serving, nothing wedged; {health.last_progress}")
    if health.reading in (Reading.CRASHED, Reading.EXITED):
        return ProbeAnswer(kind, False, said)
    if health.reading is Reading.STALLED:
        if kind is ProbeKind.STARTUP or health.serving:
            return ProbeAnswer(kind, False, said)
        return ProbeAnswer(
            kind, True, f"passing: stalled before ready, which the startup probe judges: {said}"
        )
    return ProbeAnswer(
        kind, True, f"{health.reading.value}: phase {health.phase}; last progress {health.last_progress}"
    )


def _no_data(health: Health | None, now: float) -> str | None:
    if health is None:
        return "no reading of the tree yet"
    if health.problem is not None:
        return health.problem
    age = now - health.updated_wall
    if age > max(STALE_TICKS * health.interval_s, STALE_MIN_S):
        return f"the latest reading is {age:.0f} s old (hangwatch's loop is behind)"
    return None
