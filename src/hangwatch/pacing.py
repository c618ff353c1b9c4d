"""The one schedule of every watch loop (one node's and many nodes'): a tick every interval, on a grid.

A leaf that any part may import: the loops live in supervise/ (one node) and nodes/ (many), which may not
import each other, and both must keep time alike: a tick taken behind its schedule says how late it came
(a slow /proc, NVML read, stack capture or census round), and a loop that fell behind starts the next
tick at once and does not catch up in a burst of ticks that would each see nothing new.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Pacer:
    """``late_s()`` before a tick, ``wait()`` after it. ``wait_for(delay)`` sleeps and says whether the
    loop was asked to stop meanwhile (``threading.Event.wait``); it is not called when the loop is behind."""

    def __init__(
        self,
        interval_s: float,
        wait_for: Callable[[float], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self._wait_for = wait_for
        self._clock = clock
        self._next = clock()

    def late_s(self) -> float:
        """How far behind its schedule the tick taken now is (0 when on time)."""
        return round(max(0.0, self._clock() - self._next), 3)

    def wait(self) -> bool:
        """Until the next tick is due; True when a stop was asked for meanwhile."""
        self._next += self.interval_s
        delay = self._next - self._clock()
        if delay <= 0:  # behind: the next tick now, on a grid that starts again from here
            self._next = self._clock()
            return self._wait_for(0.0)
        return self._wait_for(delay)
