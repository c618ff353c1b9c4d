"""What the analysis hands the watch loop after each tick: a frozen status to show, and what it wants next.

The loop never reads the analysis' internals: it hands ``Assessor.observe`` the tick it collected, raw,
shows ``Status``, records the tick the status says was read, collects next what the status asks for
(titles, connections), takes stacks when ``Assessor.stacks_wanted()`` asks for them (once a tick: deciding
that moves the stack schedule on), and stops when ``verdict`` says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from hangwatch.model.report import Verdict
from hangwatch.model.samples import ProbeResult
from hangwatch.model.samples import Tick


class StackRequest(StrEnum):
    """Whether the analysis wants a stack capture now, and of which kind."""

    NONE = "none"
    PYTHON = "python"  # Python frames only: a pause of milliseconds
    NATIVE = "native"  # with native frames: symbol loading, tens of milliseconds per process


@dataclass(frozen=True)
class Status:
    t: float
    phase: str
    phase_label: str
    in_phase_s: float
    phase_line: str  # the log line that opened the phase ("" for one entered by a rule)
    quiet_s: float  # seconds since the last real progress (spins discounted)
    last_progress: str  # "3 s ago (12 new log lines)"
    serving: bool
    time_to_stall_s: float | None  # None while serving (an idle server is healthy)
    probe: ProbeResult | None
    verdict: Verdict | None = None
    hint: str | None = None  # "rank0 [812] busy in the same place for 40 s" (a hint, not a verdict)
    ask: bool = False  # serving: send hangwatch's own request now (where one is allowed)
    # The tick as the analysis read it (its log lines read, its exits named by them): what the report keeps.
    tick: Tick | None = None
    # What the analysis wants collected next: titles the log lines gave untitled members (pid, title), for
    # the tree's next samples to name them by; and the server's client connections, in ticks from this
    # time on (None: not wanted; they cost a /proc/net read a tick).
    titles: tuple[tuple[int, str], ...] = ()
    connections_from_t: float | None = None
