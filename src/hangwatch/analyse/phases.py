"""Follow the startup phases from phase events; describe where a stall happened."""

from __future__ import annotations

from hangwatch.engines.profile import Profile
from hangwatch.model.report import PhaseSpan
from hangwatch.model.samples import PhaseEvent


class PhaseTracker:
    """Phases move forward only: ranks print the same lines at slightly different times, and a
    lagging rank's "Load weight end" after another rank's "KV Cache is allocated" is not a step back.
    A phase opened a second time (the draft model) is allowed whatever its position."""

    def __init__(self, profile: Profile, first: str = "process_start", first_label: str = "starting") -> None:
        self._profile = profile
        self._order = {r.name: i for i, r in enumerate(profile.phases)}
        for i, r in enumerate(profile.phases):
            if r.again:
                self._order[r.again] = i
        self._spans: list[PhaseSpan] = [PhaseSpan(first, 0.0, None, first_label, "")]

    def order_of(self, phase: str) -> int:
        """Where a phase stands in the profile's order (-1 for one it does not list)."""
        return self._order.get(phase, -1)

    @property
    def current(self) -> PhaseSpan:
        return self._spans[-1]

    @property
    def previous(self) -> PhaseSpan | None:
        return self._spans[-2] if len(self._spans) > 1 else None

    def observe(self, event: PhaseEvent) -> bool:
        """Record an event; True when it opened a new phase."""
        current = self.current
        if event.phase == current.name:
            return False
        is_again = any(r.again == event.phase for r in self._profile.phases)
        if not is_again and self._order.get(event.phase, -1) < self._order.get(current.name, -1):
            return False
        self.enter(event.phase, event.t, event.line)
        return True

    def enter(self, name: str, t: float, line: str = "") -> None:
        current = self.current
        self._spans[-1] = PhaseSpan(current.name, current.start, t, current.label, current.line)
        self._spans.append(PhaseSpan(name, t, None, self._profile.label_of(name), line))

    def spans(self, end: float | None = None) -> tuple[PhaseSpan, ...]:
        """All spans; the current one left open (end None) unless ``end`` closes it."""
        if end is None:
            return tuple(self._spans)
        last = self._spans[-1]
        return (*self._spans[:-1], PhaseSpan(last.name, last.start, end, last.label, last.line))

    def describe(self, now: float) -> str:
        """``cuda_graph (capturing CUDA graphs, for 41 s; after weights loaded)``."""
        cur = self.current
        text = f"{cur.name} ({cur.label}, for {now - cur.start:.0f} s"
        prev = self.previous
        if prev is not None:
            text += f"; after {prev.label}"
        nxt = self._next_expected()
        if nxt is not None:
            text += f", before {nxt}"
        return text + ")"

    def _next_expected(self) -> str | None:
        index = self._order.get(self.current.name)
        if index is None or index + 1 >= len(self._profile.phases):
            return None
        return self._profile.phases[index + 1].label
