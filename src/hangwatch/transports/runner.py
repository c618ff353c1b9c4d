"""One client process (ssh, kubectl, srun) run for one node under a deadline: what every transport shares.

Each runs in a session of its own, so that at the deadline its whole group (the client and anything it
started) is killed, and nothing of it outlives the call. Its exit status, output and stderr come back
as an ``Exchange``; what they mean is the transport's to say.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
U = TypeVar("U")


@dataclass(frozen=True)
class Exchange:
    """What one run gave: exit status (None: killed at the deadline), output, and when."""

    rc: int | None
    stdout: bytes
    stderr: str
    sent_wall_s: float
    received_wall_s: float


def run_bounded(argv: list[str], deadline_s: float) -> Exchange:
    """Run ``argv`` in a session of its own; SIGKILL its whole group at the deadline."""
    sent = time.time()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:  # the client itself is missing: exit status 127, as a shell would say
        return Exchange(127, b"", f"{argv[0]}: {exc.strerror}", sent, time.time())
    try:
        out, err = proc.communicate(timeout=deadline_s)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = None
    return Exchange(rc, out or b"", (err or b"").decode("utf-8", "replace"), sent, time.time())


def fan_out(targets: Sequence[T], one: Callable[[T], U], concurrency: int) -> list[U]:
    """``one(target)`` for every target, at most ``concurrency`` at once; the results in target order.

    Every transport reaches its nodes this way (a slow or dead node costs one worker, not the others).
    """
    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(targets)))) as pool:
        return list(pool.map(one, targets))
