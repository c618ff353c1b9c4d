"""The signals that stop a supervision (Ctrl-C, SIGTERM, SIGHUP), handled for the length of a block."""

from __future__ import annotations

import signal
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

Handler = Callable[[int, FrameType | None], None]


@contextmanager
def handling(handler: Handler, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> Iterator[None]:
    """``handler`` for each of ``signals`` while the block runs; the previous handlers are put back after,
    however the block ends."""
    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
