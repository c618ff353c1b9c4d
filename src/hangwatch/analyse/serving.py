"""A stall while serving: requests running or queued, and no token produced (failure mode F6).

Silence is healthy while serving (an idle server prints nothing), so only the engine's own
counters can say it is wedged: the generation-token counter frozen while requests wait on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hangwatch.model.samples import ServingSample


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

    def stall(self, now: float, stall_after: float) -> ServingStall | None:
        last = self.last
        if last is None or self.last_good_t is None or not last.busy:
            return None
        frozen = now - self.last_good_t
        if frozen < stall_after:
            return None
        evidence = (
            f"serving: {last.running or 0:.0f} requests running, {last.waiting or 0:.0f} waiting, "
            f"generation tokens frozen at {last.generated_tokens:.0f} for {frozen:.0f} s",
        )
        return ServingStall(frozen, evidence)
