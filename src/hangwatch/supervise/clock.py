"""One clock for a watch: seconds since it started, shared by the loop and every collector thread.

Ticks, probe results, /metrics scrapes and our own requests are stamped by the same clock, so that
their times can be compared (a log line that follows a probe, a request pending since a tick).
"""

from __future__ import annotations

import time


class WatchClock:
    def __init__(self) -> None:
        self.started = time.monotonic()

    def __call__(self) -> float:
        return time.monotonic() - self.started
