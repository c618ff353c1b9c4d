"""A process tree for ``hangwatch cleanup`` tests: shared memory, a stopped member, a zombie, a stubborn one.

    python cleanup_tree.py --ready FILE --shm NAME [--port N]

The root creates /dev/shm/NAME-root and /dev/shm/NAME-shared (mapped, pages touched so they take
memory), optionally listens on --port, and forks:
  mapper    maps NAME-shared and has a child of its own (depth 2)
  stopped   stops itself with SIGSTOP
  stubborn  ignores SIGTERM (needs SIGKILL)
  zombie    exits at once and is never waited for
Then it writes FILE: JSON with every pid, and sleeps. Nothing is signalled here on purpose.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import signal
import socket
import sys
import time
from pathlib import Path

SIZE = 1 << 20


def make_segment(path: str) -> mmap.mmap:
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, SIZE)
    mm = mmap.mmap(fd, SIZE)
    os.close(fd)
    mm.write(b"x" * SIZE)  # touch every page: the segment now takes memory
    return mm


def map_segment(path: str) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, SIZE)
    os.close(fd)
    return mm


def child(body) -> int:  # type: ignore[no-untyped-def]
    pid = os.fork()
    if pid == 0:
        try:
            body()
        finally:
            os._exit(0)
    return pid


def sleep_forever() -> None:
    while True:
        time.sleep(3600)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ready", required=True)
    ap.add_argument("--shm", required=True)
    ap.add_argument("--port", type=int)
    a = ap.parse_args()
    base = f"/dev/shm/{a.shm}"
    keep = [make_segment(base + "-root"), make_segment(base + "-shared")]
    listener = None
    if a.port:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", a.port))
        listener.listen()
    grandchild_file = Path(a.ready + ".grandchild")

    def mapper() -> None:
        mm = map_segment(base + "-shared")
        gc = child(sleep_forever)
        # Atomic: the parent polls for the file and must never read it half-written.
        Path(f"{grandchild_file}.tmp").write_text(str(gc))
        Path(f"{grandchild_file}.tmp").replace(grandchild_file)
        _ = mm
        sleep_forever()

    def stopped() -> None:
        os.kill(os.getpid(), signal.SIGSTOP)
        sleep_forever()

    def stubborn() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sleep_forever()

    pids = {
        "root": os.getpid(),
        "mapper": child(mapper),
        "stopped": child(stopped),
        "stubborn": child(stubborn),
    }
    pids["zombie"] = child(lambda: None)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        states = {}
        for name in ("stopped", "zombie"):
            stat = Path(f"/proc/{pids[name]}/stat").read_text()
            states[name] = stat[stat.rindex(")") + 2]
        if states == {"stopped": "T", "zombie": "Z"} and grandchild_file.exists():
            break
        time.sleep(0.02)
    pids["grandchild"] = int(grandchild_file.read_text())
    Path(a.ready + ".tmp").write_text(json.dumps(pids))
    Path(a.ready + ".tmp").replace(a.ready)
    _ = (keep, listener)
    sleep_forever()


if __name__ == "__main__":
    sys.exit(main())
