"""A stall while serving: requests waiting for an answer, and nothing produced (failure mode F6).

Silence is healthy while serving (an idle server prints nothing): a server is wedged only when
requests wait on it. Two views of that: the engine's own counters (the generation-token counter
frozen while its gauges say requests run or queue: ``ServingClock``) and, without the engine's word,
what anyone outside can see (``ServingWatch``).
"""

from __future__ import annotations

from dataclasses import dataclass

from hangwatch.model.samples import ProbeResult
from hangwatch.model.samples import ServingSample
from hangwatch.model.samples import Tick

# hangwatch's own one-token completion (run's default while serving): asked only after this much quiet
# (a server streaming tokens needs no test), at most once per half stall window and never more often than
# OWN_REQUEST_EVERY_MIN_S (a short --stall-after must not make it a load generator); a failed one is a
# reason a request waits for OWN_FAILURE_HELD_S, the next tick or so, not for the rest of the run.
OWN_REQUEST_QUIET_S = 3.0
OWN_REQUEST_EVERY_MIN_S = 5.0
OWN_FAILURE_HELD_S = 5.0


@dataclass(frozen=True)
class ServingStall:
    frozen_for_s: float
    evidence: tuple[str, ...]


class ServingClock:
    """When did the server last produce a token while it had work, or last have no work at all."""

    def __init__(self) -> None:
        self.last_good_t: float | None = None
        self.last: ServingSample | None = None

    def observe(self, sample: ServingSample) -> None:
        if sample.error is not None or sample.generated_tokens is None:
            return  # an unreadable scrape says nothing either way
        moved = self.last is not None and sample.generated_tokens != self.last.generated_tokens
        if self.last_good_t is None or moved or not sample.busy:
            self.last_good_t = sample.t
        self.last = sample

    @property
    def busy(self) -> bool:
        return self.last is not None and self.last.busy

    def stall(self, now: float, stall_after_s: float) -> ServingStall | None:
        last = self.last
        if last is None or self.last_good_t is None or not last.busy:
            return None
        frozen = now - self.last_good_t
        if frozen < stall_after_s:
            return None
        evidence = (
            f"serving: {last.running or 0:.0f} requests running, {last.waiting or 0:.0f} waiting, "
            f"generation tokens frozen at {last.generated_tokens:.0f} for {frozen:.0f} s",
        )
        return ServingStall(frozen, evidence)


# A one-token completion on a server that is not wedged answers in well under this, even queued
# behind a few requests on a slow CPU build; longer, it counts as a request waiting.
OWN_REQUEST_SLOW_S = 2.0


class ServingWatch:
    """Requests waiting for an answer, seen from outside the engine, and since when they have waited.

    Three witnesses, any of which will do: the server's accepted client connections whose last
    request came after its last answer (the kernel's TCP state: connections.py), hangwatch's own
    one-token completion still pending, and a readiness probe that was green and now fails. The
    engine's gauges are not needed: vLLM publishes them only with the outputs of a finished step,
    so a first step that never ends leaves them at 0.
    """

    def __init__(self) -> None:
        self.waiting_since: float | None = None
        self._asked_t: float | None = None  # when our own request was last sent
        self._clients = False  # clients have connections open on the server
        self._reasons: tuple[str, ...] = ()
        self._green_until: float | None = None  # the last time the probe answered 2xx
        self._failing_since: float | None = None
        self._last_probe: ProbeResult | None = None

    def observe(self, tick: Tick) -> None:
        reasons = list(self._probe_reasons(tick))
        if tick.own_request is not None:
            self._asked_t = tick.own_request.sent_t
        self._clients = tick.connections is not None and bool(tick.connections.theirs)
        if tick.connections is not None:
            waiting = tick.connections.unanswered
            if waiting:
                longest = max(c.unanswered_s or 0.0 for c in waiting)
                ports = ", ".join(str(p) for p in sorted({c.port for c in waiting}))
                reasons.append(
                    f"{len(waiting)} client connection{'s' if len(waiting) != 1 else ''} on port {ports} "
                    f"sent a request and got no answer (the oldest for {longest:.0f} s)"
                )
        own = tick.own_request
        pending = own.pending_for(tick.t) if own is not None else None
        if own is not None and pending is not None and pending >= OWN_REQUEST_SLOW_S:
            reasons.append(f"hangwatch's own one-token completion ({own.url}) pending for {pending:.0f} s")
        elif (
            own is not None
            and own.done_t is not None
            and not own.answered
            and tick.t - own.done_t < OWN_FAILURE_HELD_S
        ):
            reasons.append(f"hangwatch's own one-token completion failed: {own.detail}")
        if reasons:
            if self.waiting_since is None:
                self.waiting_since = tick.t
        else:
            self.waiting_since = None
        self._reasons = tuple(reasons)

    def _probe_reasons(self, tick: Tick) -> tuple[str, ...]:
        for probe in tick.probes:
            if probe.green:
                self._green_until, self._failing_since = probe.t, None
            elif self._green_until is not None and self._failing_since is None:
                self._failing_since = probe.t
        if tick.probes:
            self._last_probe = tick.probes[-1]
        # Still failing between probes: a patient probe waits up to 30 s for a slow server's answer,
        # and the evidence must not lapse on every tick without a new outcome.
        last = self._last_probe
        if self._failing_since is None or last is None:
            return ()
        return (
            f"{last.url} was green while serving and has failed for {tick.t - self._failing_since:.0f} s "
            f"({last.describe()})",
        )

    def wants_own_request(self, now: float, quiet_s: float, busy: bool, stall_after_s: float) -> bool:
        """Ask the server ourselves: once when it turns ready, then when clients are connected (or its
        gauges say it is busy) and the tree has gone quiet, at most once per half window."""
        if self._asked_t is None:
            return True
        if quiet_s < OWN_REQUEST_QUIET_S or not (self._clients or busy or self.waiting_since is not None):
            return False
        return now - self._asked_t >= max(stall_after_s / 2, OWN_REQUEST_EVERY_MIN_S)

    def waiting(self, now: float, last_progress_t: float) -> ServingStall | None:
        """Requests wait, and nothing moved since they began to (or since the last progress): how long."""
        if self.waiting_since is None:
            return None
        return ServingStall(now - max(self.waiting_since, last_progress_t), self._reasons)

    def stall(self, now: float, last_progress_t: float, stall_after_s: float) -> ServingStall | None:
        """Requests have waited, and nothing moved, for the whole window."""
        waiting = self.waiting(now, last_progress_t)
        return waiting if waiting is not None and waiting.frozen_for_s >= stall_after_s else None
