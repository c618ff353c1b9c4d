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

import signal

from _ranks import Rank
from _ranks import parse_args
from _ranks import start_ranks
from _util import log


def rank_main(r: Rank) -> None:
    """One rank: report in, then either stop itself (the victim) or wait for the victim's message."""
    r.report_in("self_stop")
    if r.is_victim:
        r.act(signal.SIGSTOP)
        log(f"[rank {r.rank}] continued")
        for _ in range(r.ranks - 1):
            r.mailbox.put(f"hello from rank {r.rank}")
        return
    log(f"[rank {r.rank}] got {r.wait_for_victim()!r}")  # blocks for as long as the victim is stopped


def main() -> None:
    """Parse arguments, start the ranks and wait on all of them."""
    args = parse_args(__doc__.split("\n\n")[0], "SIGSTOPs itself", "seconds between ready and the stop")
    for proc in start_ranks(args, rank_main):
        proc.join()
    log("launcher: all ranks finished")


if __name__ == "__main__":
    main()
