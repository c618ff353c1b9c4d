"""A launcher that misbehaves while it is being shut down, for the "nothing outlives hangwatch" tests.

    python unruly_launcher.py --ready-file F --ledger L [--children N] [--ignore-term S]
                              [--respawn] [--diagnostics-after S] [--handoff] [--detach]
                              [--main-thread-exits]

Every process this tree ever starts appends ``pid starttime`` to the ledger (O_APPEND, one write),
so a test can check afterwards that none of them is left, pid reuse ruled out. The launcher forks
``--children`` sleepers, writes the ready file, and sleeps. On SIGTERM:

* ``--ignore-term S``: the launcher ignores it and exits S seconds later (default: exits at once);
* ``--respawn``: meanwhile it keeps killing its children and starting new ones (every 0.1 s);
* ``--diagnostics-after S``: it sleeps S seconds, then starts one new process (SGLang: "Sleeping 5
  seconds before crash diagnostics");
* ``--handoff``: each child, on SIGTERM, starts a new process 0.2 s later and exits;
* ``--detach``: every process started after SIGTERM calls setsid(): it leaves the launched session,
  so that only its parentage (or being told about it) ties it to the tree.

``--main-thread-exits``: each child ignores SIGTERM, starts a thread that sleeps for ever and ends its
own main thread alone (the exit syscall, not exit_group). /proc then shows it as a zombie (state Z is
the main thread's), yet it runs on and cannot be reaped: only SIGKILL ends it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import platform
import signal
import threading
import time
from pathlib import Path


def starttime(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw[raw.rindex(")") + 2 :].split()[19])


def record(ledger: str) -> None:
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{os.getpid()} {starttime(os.getpid())}\n".encode())
    finally:
        os.close(fd)


def fork(ledger: str, body, detach: bool = False) -> int:  # type: ignore[no-untyped-def]
    pid = os.fork()
    if pid == 0:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            if detach:
                os.setsid()
            record(ledger)
            body()
        finally:
            os._exit(0)
    return pid


def sleep_forever() -> None:
    while True:
        time.sleep(3600)


# The exit syscall (this thread only), by architecture: glibc has no wrapper for it.
SYS_EXIT = {"x86_64": 60, "aarch64": 93}


def main_thread_exits() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=sleep_forever, name="lingering").start()
    ctypes.CDLL(None, use_errno=True).syscall(SYS_EXIT[platform.machine()], 0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ready-file", required=True)
    ap.add_argument("--ledger", required=True)
    ap.add_argument("--children", type=int, default=2)
    ap.add_argument("--ignore-term", type=float, default=0.0)
    ap.add_argument("--respawn", action="store_true")
    ap.add_argument("--diagnostics-after", type=float)
    ap.add_argument("--handoff", action="store_true")
    ap.add_argument("--detach", action="store_true")
    ap.add_argument("--main-thread-exits", action="store_true")
    a = ap.parse_args()
    record(a.ledger)
    terminated = False

    def on_term(signum, frame):  # type: ignore[no-untyped-def]
        nonlocal terminated
        terminated = True

    def handoff_child() -> None:
        def handoff(signum, frame):  # type: ignore[no-untyped-def]
            time.sleep(0.2)
            fork(a.ledger, sleep_forever, detach=a.detach)
            os._exit(0)

        signal.signal(signal.SIGTERM, handoff)
        sleep_forever()

    body = handoff_child if a.handoff else main_thread_exits if a.main_thread_exits else sleep_forever
    children = [fork(a.ledger, body) for _ in range(a.children)]
    signal.signal(signal.SIGTERM, on_term)
    Path(a.ready_file + ".tmp").write_text(str(os.getpid()))
    Path(a.ready_file + ".tmp").replace(a.ready_file)
    while not terminated:
        time.sleep(0.05)
    print("launcher: SIGTERM received, shutting down", flush=True)
    end = time.monotonic() + a.ignore_term
    if a.diagnostics_after is not None:
        print(f"launcher: sleeping {a.diagnostics_after:g} seconds before crash diagnostics", flush=True)
        time.sleep(a.diagnostics_after)
        fork(a.ledger, sleep_forever, detach=a.detach)
    while time.monotonic() < end:
        if a.respawn:
            for pid in children:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            children = [fork(a.ledger, sleep_forever, detach=a.detach) for _ in range(a.children)]
        while True:  # reap what ended
            try:
                got, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if got == 0:
                break
        time.sleep(0.1)


if __name__ == "__main__":
    main()
