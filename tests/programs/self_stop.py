"""A launcher whose rank stops itself with SIGSTOP while its peers and the launcher wait forever.

The launcher starts ``--ranks`` ranks (default 2) with the ``spawn`` start method; each names itself
``self_stop:rR`` and prints ``[rank R] init``. Once all ranks are up the launcher writes
``--ready-file``; then rank ``--victim`` (default 1) sleeps ``--delay`` seconds and sends itself SIGSTOP
(state T, as if a debugger or a stray ``kill -STOP`` froze it), while every other rank waits on a
``multiprocessing.Queue.get()`` for a message from the victim, and the launcher ``join()``s every rank.
Nothing errors and nothing exits. After a SIGCONT the victim sends its messages and everyone exits 0.

Example::

    python tests/programs/self_stop.py --ranks 3 --victim 0 --delay 0.5
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
    rank: int, ranks: int, victim: int, delay: float, up: Queue[int], all_up: Event, mailbox: Queue[str]
) -> None:
    """One rank: report in, then either stop itself (the victim) or wait for the victim's message."""
    set_title(f"self_stop:r{rank}")
    log(f"[rank {rank}] init")
    up.put(rank)
    if rank == victim:
        all_up.wait()  # the launcher has written the ready file: the stop now comes after it
        time.sleep(delay)
        log(f"[rank {rank}] sending SIGSTOP to myself")
        os.kill(os.getpid(), signal.SIGSTOP)
        log(f"[rank {rank}] continued")
        for _ in range(ranks - 1):
            mailbox.put(f"hello from rank {rank}")
        return
    log(f"[rank {rank}] waiting for rank {victim}")
    log(f"[rank {rank}] got {mailbox.get()!r}")  # blocks for as long as the victim is stopped


def main() -> None:
    """Parse arguments, start the ranks and wait on all of them."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="number of rank processes")
    parser.add_argument("--victim", type=int, default=1, help="the rank that SIGSTOPs itself")
    parser.add_argument("--delay", type=float, default=1.0, help="seconds between ready and the stop")
    add_ready_file_arg(parser)
    args = parser.parse_args()
    if not 0 <= args.victim < args.ranks:
        parser.error("--victim must be a rank in [0, --ranks)")

    ctx = mp.get_context("spawn")
    up: Queue[int] = ctx.Queue()
    mailbox: Queue[str] = ctx.Queue()
    all_up = ctx.Event()
    ranks = [
        ctx.Process(
            target=rank_main,
            args=(r, args.ranks, args.victim, args.delay, up, all_up, mailbox),
            name=f"rank{r}",
        )
        for r in range(args.ranks)
    ]
    for proc in ranks:
        proc.start()
    for _ in ranks:
        up.get()
    log(f"launcher: all {args.ranks} ranks up: " + ", ".join(f"rank{r}={p.pid}" for r, p in enumerate(ranks)))
    write_ready(args.ready_file)
    all_up.set()
    for proc in ranks:
        proc.join()
    log("launcher: all ranks finished")


if __name__ == "__main__":
    main()
