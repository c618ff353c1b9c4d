"""What ``hangwatch watch`` (the sidecar) knows at one moment, and what each of its probes answers.

A snapshot, replaced whole at every tick of the watch: the HTTP server reads the latest one and never
waits on the loop, a capture or a lock (each answer in microseconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from hangwatch.model.report import Verdict


class Reading(StrEnum):
    """The sidecar's rolling state of the tree (the verdict's state while one stands, else what the watch
    sees now). Unlike a run's verdict it can go back: a stall that ends reads ``progressing`` again."""

    WAITING = "waiting"  # no tree to watch yet (its process not started, or not matched yet)
    PROGRESSING = "progressing"  # starting, not ready, nothing wedged
    READY = "ready"
    STALLED = "stalled"
    CRASHED = "crashed"
    EXITED = "exited"


class ProbeKind(StrEnum):
    STARTUP = "startup"
    LIVENESS = "liveness"
    READINESS = "readiness"


@dataclass(frozen=True)
class Health:
    reading: Reading
    target: str  # "pid 812 (python -m sglang.launch_server ...)", redacted; or what it waits for
    t: float  # seconds on the watch's clock
    updated_wall: float  # Unix time of this snapshot (a stale one means the loop itself is stuck)
    interval_s: float
    phase: str
    in_phase_s: float
    phases: tuple[tuple[str, float], ...]  # each phase entered so far and its duration, in order
    serving: bool  # the engine's readiness rule held once: it serves
    quiet_s: float
    last_progress_wall: float | None  # Unix time of the last progress (None before any)
    last_progress: str  # "3 s ago (12 new log lines)"
    time_to_stall_s: float | None
    # The readiness probe's last answer: True 2xx, False anything else, None with no probe (or none yet).
    probe_green: bool | None
    probe_said: str  # the probe's last answer in words ("" with none)
    verdict: Verdict | None  # the verdict that stands (None while progressing, or after a recovery)
    stalls: int  # stalled verdicts so far (a new one each time the tree stalls again)
    recoveries: int  # stalls that ended: the tree progressed again
    verdicts: tuple[tuple[str, int], ...]  # state -> verdicts reached in that state
    captures: int  # stack captures taken
    capture_s: float  # their total time (each pauses its targets for milliseconds)
    culprit_ranks: tuple[str, ...]  # the standing verdict's culprits, as their ranks are spelled
    # Each GPU the tree holds memory on: (index, UUID or "", "spinning" | "idle" | "working" | "unknown").
    gpus: tuple[tuple[int, str, str], ...] = ()
    # hangwatch's own trouble (no target found yet, the loop behind): the probes fail open then.
    problem: str | None = None


@dataclass(frozen=True)
class ProbeAnswer:
    kind: ProbeKind
    ok: bool
    reason: str  # one line: why it passes or fails (the kubelet keeps it in the pod's events)

    @property
    def status(self) -> int:
        return 200 if self.ok else 503
