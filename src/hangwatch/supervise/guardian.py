"""A tiny watchdog process that kills the launched tree if hangwatch itself dies.

hangwatch cleans up after itself on a verdict, Ctrl-C and SIGTERM; but SIGKILL (or a crash)
gives it no chance, and a server left behind keeps its GPUs. The guardian runs in a session of
its own, reads a pipe from hangwatch, and learns each member of the tree (``pid starttime``
lines). When the pipe closes without the word ``clean`` (hangwatch died), it kills the session
and every member still alive, checked by start time so that a reused pid is never touched.

Run as ``python -m hangwatch.supervise.guardian SESSION_ID`` with the pipe as stdin.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from hangwatch.collect import procfs

CLEAN = b"clean"


def members(session: int, identities: set[tuple[int, int]]) -> list[int]:
    found = []
    me = os.getpid()
    for pid in procfs.list_pids():
        if pid == me:
            continue
        stat = procfs.read_stat(pid)
        if stat is None:
            continue
        if stat.session == session or stat.identity in identities:
            found.append(pid)
    return found


def kill_all(session: int, identities: set[tuple[int, int]]) -> None:
    for _ in range(3):  # a dying parent can fork once more; sweep again
        pids = members(session, identities)
        if not pids:
            return
        for pid in pids:
            for sig in (signal.SIGKILL, signal.SIGCONT):
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)


def main(argv: list[str]) -> int:
    try:
        import setproctitle

        setproctitle.setproctitle(f"hangwatch::guardian {argv[1]}")
    except ImportError:  # a cosmetic: ps shows python instead
        pass
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    session = int(argv[1])
    identities: set[tuple[int, int]] = set()
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
                identities.add((int(pid), int(start)))
    if buffered == CLEAN:
        return 0
    kill_all(session, identities)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
