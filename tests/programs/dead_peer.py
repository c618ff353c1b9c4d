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

import signal

from _ranks import Rank
from _ranks import parse_args
from _ranks import start_ranks


def rank_main(r: Rank) -> None:
    """One rank: report in, then either die (the victim) or wait for the victim's message."""
    r.report_in("dead_peer")
    if r.is_victim:
        r.act(signal.SIGKILL)
    r.wait_for_victim()  # blocks forever once the victim is gone


def main() -> None:
    """Parse arguments, start the ranks and wait on the survivors."""
    args = parse_args(__doc__.split("\n\n")[0], "SIGKILLs itself", "seconds between ready and the kill")
    for rank, proc in enumerate(start_ranks(args, rank_main)):
        if rank != args.victim:
            proc.join()  # never returns: the survivors wait for the dead rank


if __name__ == "__main__":
    main()
