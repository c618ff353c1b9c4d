"""A classic lock-order deadlock between two threads, made certain by a handshake.

Thread ``worker-A`` takes ``lock_a`` and thread ``worker-B`` takes ``lock_b``; each then waits (Event)
until the other holds its first lock, and only then asks for the other's lock: A wants ``lock_b``, B
wants ``lock_a``, and neither can ever get it. The main thread ``join()``s both. Once both threads hold
their first lock the program prints ``deadlocked`` and writes ``deadlocked`` to ``--ready-file``. All
three threads then sleep in futex waits: state S, 0 % CPU, no output, forever.

Example::

    python tests/programs/lock_deadlock.py --ready-file /tmp/ready
"""

from __future__ import annotations

import argparse
import threading

from _util import add_ready_file_arg
from _util import log
from _util import write_ready

lock_a = threading.Lock()
lock_b = threading.Lock()
a_holds_first = threading.Event()
b_holds_first = threading.Event()


def take_a_then_b() -> None:
    """Worker A: lock_a, wait for B to hold lock_b, then block on lock_b forever."""
    with lock_a:
        a_holds_first.set()
        b_holds_first.wait()
        with lock_b:  # never acquired
            log("worker-A got both locks")


def take_b_then_a() -> None:
    """Worker B: lock_b, wait for A to hold lock_a, then block on lock_a forever."""
    with lock_b:
        b_holds_first.set()
        a_holds_first.wait()
        with lock_a:  # never acquired
            log("worker-B got both locks")


def main() -> None:
    """Start both workers, announce the deadlock and join them."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_ready_file_arg(parser)
    args = parser.parse_args()

    workers = [
        threading.Thread(target=take_a_then_b, name="worker-A"),
        threading.Thread(target=take_b_then_a, name="worker-B"),
    ]
    for worker in workers:
        worker.start()
    a_holds_first.wait()
    b_holds_first.wait()
    log("deadlocked")
    write_ready(args.ready_file, "deadlocked\n")
    for worker in workers:
        worker.join()


if __name__ == "__main__":
    main()
