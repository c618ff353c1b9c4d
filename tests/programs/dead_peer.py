"""A launcher whose rank dies of SIGKILL while its peers wait for it forever, with no error anywhere.

The launcher starts ``--ranks`` ranks (default 2) with the ``spawn`` start method. Each rank names
itself ``dead_peer:rR`` (setproctitle when installed, else /proc/PID/comm only) and prints
``[rank R] init``. Once all ranks are up the launcher writes ``--ready-file``; then rank ``--victim``
(default 1) sleeps ``--delay`` seconds and SIGKILLs itself, while every other rank waits in a
``multiprocessing.Queue.get()`` without timeout for a message the victim would have sent. The launcher
only ``join()``s the surviving ranks, so nobody notices: the victim stays a zombie (state Z; its parent
never reaps it), the peers sleep (state S, 0 % CPU), and no error is ever printed. This is what a
rank killed by the OOM killer looks like under a naive launcher.

Example::

    python tests/programs/dead_peer.py --ranks 4 --victim 2 --delay 1
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event

from _util import add_ready_file_arg
from _util import log
from _util import set_title
from _util import write_ready


def rank_main(
    rank: int, victim: int, delay: float, up: Queue[int], all_up: Event, mailbox: Queue[str]
) -> None:
    """One rank: report in, then either die (the victim) or wait for the victim's message."""
    set_title(f"dead_peer:r{rank}")
    log(f"[rank {rank}] init")
    up.put(rank)
    if rank == victim:
        all_up.wait()  # the launcher has written the ready file: the kill now comes after it
        time.sleep(delay)
        log(f"[rank {rank}] sending SIGKILL to myself")
        os.kill(os.getpid(), signal.SIGKILL)
    log(f"[rank {rank}] waiting for rank {victim}")
    mailbox.get()  # no timeout: blocks forever once the victim is gone


def main() -> None:
    """Parse arguments, start the ranks and wait on the survivors."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="number of rank processes")
    parser.add_argument("--victim", type=int, default=1, help="the rank that SIGKILLs itself")
    parser.add_argument("--delay", type=float, default=1.0, help="seconds between ready and the kill")
    add_ready_file_arg(parser)
    args = parser.parse_args()
    if not 0 <= args.victim < args.ranks:
        parser.error("--victim must be a rank in [0, --ranks)")

    ctx = mp.get_context("spawn")
    up: Queue[int] = ctx.Queue()
    mailbox: Queue[str] = ctx.Queue()
    all_up = ctx.Event()
    ranks = [
        ctx.Process(target=rank_main, args=(r, args.victim, args.delay, up, all_up, mailbox), name=f"rank{r}")
        for r in range(args.ranks)
    ]
    for proc in ranks:
        proc.start()
    for _ in ranks:
        up.get()
    log(f"launcher: all {args.ranks} ranks up: " + ", ".join(f"rank{r}={p.pid}" for r, p in enumerate(ranks)))
    write_ready(args.ready_file)
    all_up.set()
    for rank, proc in enumerate(ranks):
        if rank != args.victim:
            proc.join()  # never returns: the survivors wait for the dead rank


if __name__ == "__main__":
    main()
