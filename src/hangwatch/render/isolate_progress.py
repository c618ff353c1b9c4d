"""``hangwatch isolate``'s live progress: plain lines (trial k of n, its run, phase, verdict, time left).

The server's own output is not echoed (each run keeps it in its ``output.log``); the phase is said when
it changes, so a hang shows where it sits while the stall window runs out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hangwatch.model.report import Verdict
from hangwatch.render.live import LiveState

if TYPE_CHECKING:
    from hangwatch.model.isolate import RunResult


def verdict_line(v: Verdict) -> str:
    """``STALLED (cuda-graph-capture) in phase cuda_graph``."""
    cause = f" ({v.cause.value})" if v.cause else ""
    phase = f" in phase {v.phase.split(' (', 1)[0]}" if v.phase else ""
    return f"{v.state.value.upper()}{cause}{phase}"


def _left(left_s: float | None) -> str:
    return "" if left_s is None else f"; {max(left_s, 0):.0f} s of --budget left"


class TrialView:
    """A run's view: no echo, one line per phase change.

    ``on_tick`` is called on every tick of the run's watch, from inside it (isolate passes on a Ctrl-C
    that came while the run was being launched, before the watch's own handler was in place).
    """

    def __init__(
        self, label: str, say: Callable[[str], None], on_tick: Callable[[], None] | None = None
    ) -> None:
        self._label = label
        self._say = say
        self._phase: str | None = None
        self._on_tick = on_tick

    def echo(self, data: bytes) -> None:
        return None

    def update(self, state: LiveState) -> None:
        if self._on_tick is not None:
            self._on_tick()
        if state.phase != self._phase:
            self._phase = state.phase
            self._say(f"{self._label}: phase {state.phase} ({state.phase_label}) at {state.t:.1f} s")

    def event(self, text: str) -> None:
        return None

    def block(self, text: str) -> None:
        return None  # no --keep-running here: a trial, a bench server, ends at its verdict

    def close(self) -> None:
        return None


class Progress:
    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say

    def view(self, label: str, on_tick: Callable[[], None] | None = None) -> TrialView:
        return TrialView(label, self.say, on_tick)

    def start(self, label: str, number: int, repeat: int, change: str, left_s: float | None) -> None:
        run = f", run {number} of {repeat}" if repeat > 1 else ""
        self.say(f"{label}{run}: starting ({change}){_left(left_s)}")

    def finished(self, label: str, number: int, repeat: int, run: RunResult, left_s: float | None) -> None:
        which = f", run {number} of {repeat}" if repeat > 1 else ""
        self.say(
            f"{label}{which}: {verdict_line(run.verdict)} after {run.duration_s:.1f} s "
            f"(+{run.overhead_s:.1f} s clean-up and start){_left(left_s)}"
        )
