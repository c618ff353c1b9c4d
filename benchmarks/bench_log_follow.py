"""What following a log file costs attach: the follower thread's CPU, with inotify and with polling.

Prints the CPU the follower used over ``--seconds`` for a quiet file and for one written ``--rate``
lines a second, each way. Attach follows the server's log in a thread so that each line is stamped when
it is written (collect/logtail.py); the figures go in docs/verdicts.md.

    .venv/bin/python benchmarks/bench_log_follow.py --seconds 20
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import hangwatch.collect.logtail as logtail
from hangwatch.collect.logtail import FileLog


def measure(path: Path, seconds: float, rate: float, polling: bool) -> float:
    """Percent of a core the follower used (this process's CPU, minus a writer's when there is one)."""
    real = logtail._Inotify
    if polling:

        def refuse(path: Path) -> logtail._Inotify:
            raise OSError("polling asked for")

        logtail._Inotify = refuse  # type: ignore[assignment,misc]
    stop = threading.Event()
    writer_cpu = [0.0]

    def write() -> None:
        start = time.thread_time()
        with path.open("a", buffering=1) as f:
            while not stop.wait(1.0 / rate):
                f.write("INFO a line of the server's log\n")
        writer_cpu[0] = time.thread_time() - start

    try:
        log = FileLog(path, clock=time.monotonic)
        t0 = time.process_time()
        w0 = time.monotonic()
        thread = threading.Thread(target=write) if rate > 0 else None
        if thread is not None:
            thread.start()
        deadline = w0 + seconds
        while time.monotonic() < deadline:
            time.sleep(1.0)
            log.drain()  # as a tick does
        stop.set()
        if thread is not None:
            thread.join()
        cpu = time.process_time() - t0 - writer_cpu[0]
        wall = time.monotonic() - w0
        log.close()
    finally:
        logtail._Inotify = real  # type: ignore[misc]
    return 100.0 * cpu / wall


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=10.0, help="lines a second in the written case")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "server.log"
        path.write_text("")
        print(f"following a log file for {args.seconds:g} s (CPU of the follower and the 1 s drains)")
        for polling in (False, True):
            how = f"polling every {logtail.POLL_EVERY_S:g} s" if polling else "inotify"
            for rate in (0.0, args.rate):
                pct = measure(path, args.seconds, rate, polling)
                what = "quiet file" if rate == 0 else f"{rate:g} lines/s"
                print(f"  {how:<22} {what:<12} {pct:.3f} % of a core")


if __name__ == "__main__":
    main()
