"""A tiny watchdog process that kills the launched tree if hangwatch itself dies.

hangwatch cleans up after itself on a verdict, Ctrl-C and SIGTERM; but SIGKILL (or a crash)
gives it no chance, and a server left behind keeps its GPUs. The guardian runs in a session of
its own, reads a pipe from hangwatch, and learns each member of the tree (``pid starttime``
lines), before hangwatch signals any of them. When the pipe closes without the word ``clean``
(hangwatch died, even halfway through its own clean-up), it freezes and kills the session, every
known member still alive (checked by start time, so that a reused pid is never touched) and what
descends from them, and keeps killing what still turns up for a bounded time.

Run as ``python -m hangwatch.supervise.guardian SESSION_ID`` with the pipe as stdin.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterable

from hangwatch.collect import procfs
from hangwatch.model.samples import ProcessId
from hangwatch.supervise import membership

CLEAN = b"clean"
KEEP_KILLING_S = 15.0  # after hangwatch died: how long new members of the tree are still killed


def members(session: int, identities: set[ProcessId]) -> dict[int, procfs.Stat]:
    """Live members: the session, known members, and what descends from them (membership.py)."""
    return membership.alive(membership.scan(identities, (session,), exclude={os.getpid()}))


def _signal(pids: Iterable[int], *sigs: int) -> None:
    for pid in pids:
        for sig in sigs:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)


def kill_all(session: int, identities: set[ProcessId], keep_s: float = KEEP_KILLING_S) -> None:
    """Freeze, then kill, then keep killing for ``keep_s``.

    Killing a parent first would orphan a child it just forked (reparented to init: no longer ours
    to find); a stopped process forks no more, so every member is SIGSTOPped until a scan finds no new
    one, and only then is everything SIGKILLed. Afterwards whatever still turns up (a member that was
    in the kernel, a child forked on the way out) is killed, until none is left or ``keep_s`` passes.
    """
    frozen: dict[int, ProcessId] = {}
    for _ in range(100):
        new = {pid: s.identity for pid, s in members(session, identities | set(frozen.values())).items()}
        new = {pid: ident for pid, ident in new.items() if frozen.get(pid) != ident}
        if not new:
            break
        _signal(new, signal.SIGSTOP)
        frozen.update(new)
    known = identities | set(frozen.values())
    _signal(frozen, signal.SIGKILL, signal.SIGCONT)
    deadline = time.monotonic() + keep_s
    while time.monotonic() < deadline:
        left = members(session, known)
        if not left:
            return
        known |= {s.identity for s in left.values()}
        _signal(left, signal.SIGKILL, signal.SIGCONT)
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    try:
        import setproctitle

        setproctitle.setproctitle(f"hangwatch::guardian {argv[1]}")
    except ImportError:  # a cosmetic: ps shows python instead
        pass
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    session = int(argv[1])
    identities: set[ProcessId] = set()
    buffered = b""
    while True:
        chunk = os.read(sys.stdin.fileno(), 4096)
        if not chunk:
            break
        buffered += chunk
        *lines, buffered = buffered.split(b"\n")
        for line in lines:
            if line == CLEAN:
                return 0
            pid, _, start = line.partition(b" ")
            if pid.isdigit() and start.isdigit():
                identities.add(ProcessId(int(pid), int(start)))
    if buffered == CLEAN:
        return 0
    kill_all(session, identities)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
