"""A stand-in for an engine's CUDA graph runner whose ``capture`` never finishes (no GPU involved).

Named like SGLang's ``cuda_graph_runner.py`` so that a Python stack of the hung rank reads
``capture (cuda_graph_runner.py)``, which is what a hang-diagnosis tool should surface.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class CudaGraphRunner:
    """Captures "graphs" for a list of batch sizes; one of them hangs forever."""

    def __init__(self, batch_sizes: list[int], hang_at: int, log: Callable[[str], None]) -> None:
        self.batch_sizes = batch_sizes
        self.hang_at = hang_at
        self.log = log
        # Never set: stands for the stream sync / collective that the real capture is stuck in.
        self._capture_done = threading.Event()

    def capture(self) -> None:
        """Capture every batch size, largest first, as the engines do; blocks at ``hang_at``."""
        for bs in sorted(self.batch_sizes, reverse=True):
            self.log(f"Capturing batches (bs={bs} avail_mem=1.23 GB)")
            if bs == self.hang_at:
                self._capture_done.wait()  # forever: state S, no CPU
