"""Measure the sidecar (`hangwatch watch`) and print the figures.

* answer latency of each endpoint (the goal: milliseconds, never waiting on a tick or a capture), over N
  sequential requests on loopback, while the watch loop runs and takes its stack captures;
* the sidecar's own CPU while it watches a healthy, progressing program (goal: under 1 % of a core at the
  default 1 s interval, as for `run`; measured after its first 5 s);
* how long after the last sign of progress a hung program's /startup turns 503 (goal: --stall-after +
  2 s, the window + latency of `run`).

    python benchmarks/bench_sidecar.py [--requests 300] [--watch-s 30]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tests" / "programs" / "progress_then_hang.py"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
STALL_S = 10


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            reply.read()
            return int(reply.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def sidecar(pid: int, port: int, folder: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "hangwatch", "watch", "--quiet", "--pid", str(pid), "--stall-after",
            str(STALL_S), "--listen", f"127.0.0.1:{port}", "--evidence-dir", str(folder)]  # fmt: skip
    popen = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            status_of(f"http://127.0.0.1:{port}/")
            return popen
        except OSError:
            time.sleep(0.05)
    raise SystemExit("the sidecar did not listen within 30 s")


def stop(car: subprocess.Popen[bytes], program: subprocess.Popen[bytes], log: IO[str]) -> None:
    """The sidecar first (it never signals its target), then the program it watched."""
    car.send_signal(signal.SIGTERM)
    car.wait(timeout=20)
    program.kill()
    program.wait()
    log.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--watch-s", type=float, default=30.0)
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        # A healthy program: progress lines with real work between them, for good.
        log = (folder / "healthy.log").open("w")
        healthy = subprocess.Popen(
            [sys.executable, str(PROGRAM), "--seconds", "1", "--resume-after", "0"], stdout=log, stderr=log
        )
        port = free_port()
        car = sidecar(healthy.pid, port, folder / "ev")
        try:
            base = f"http://127.0.0.1:{port}"
            print(f"answer latency over {args.requests} sequential requests each (ms):")
            print("| endpoint | median | p99 | max |")
            print("|---|---|---|---|")
            for path in ("/startup", "/live", "/ready", "/verdict", "/metrics"):
                times = []
                for _ in range(args.requests):
                    start = time.perf_counter()
                    status_of(base + path)
                    times.append((time.perf_counter() - start) * 1000)
                times.sort()
                p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
                print(f"| {path} | {statistics.median(times):.2f} | {p99:.2f} | {times[-1]:.2f} |")
            time.sleep(5)
            before, t0 = cpu_s(car.pid), time.monotonic()
            time.sleep(args.watch_s)
            used = cpu_s(car.pid) - before
            share = used / (time.monotonic() - t0) * 100
            print(f"sidecar CPU over {args.watch_s:g} s of a healthy program: {share:.2f} % of a core")
        finally:
            stop(car, healthy, log)
        # A program that hangs after 3 s: when does /startup turn 503?
        log = (folder / "hung.log").open("w")
        ready = folder / "hung.ready"
        argv = [sys.executable, str(PROGRAM), "--seconds", "3", "--ready-file", str(ready)]
        hung = subprocess.Popen(argv, stdout=log, stderr=log)
        port = free_port()
        car = sidecar(hung.pid, port, folder / "ev2")
        try:
            while not ready.exists():
                time.sleep(0.01)
            last_progress = ready.stat().st_mtime
            while status_of(f"http://127.0.0.1:{port}/startup") == 200:
                time.sleep(0.1)
            late = time.time() - last_progress
            goal = f"--stall-after {STALL_S}; goal {STALL_S + 2} s"
            print(f"/startup 503 after {late:.1f} s of silence ({goal})")
        finally:
            stop(car, hung, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
