"""A rank SIGKILLs itself while its peers wait for it in ``all_reduce``: gloo notices at once.

``--world-size`` ranks (default 2) form a gloo group and do one warm-up all_reduce. Then every rank but
``--victim`` (default the last) enters a second all_reduce, and the victim waits for the launcher's
go-ahead (given after ``--ready-file`` is written), sleeps ``--delay`` seconds and SIGKILLs itself.

What really happens (torch 2.13.0 CPU, gloo over TCP on loopback): despite the one-hour timeout the
peers do NOT hang. The kernel closes the victim's sockets, gloo's pair sees EOF and every waiting peer
raises at once (within milliseconds) ``RuntimeError: [.../gloo/transport/tcp/pair.cc:553] Connection
closed by peer [127.0.0.1]:PORT. This is typically caused by a remote worker crashing. ...``, exits 1
with that traceback on stderr, and the launcher exits 1 after reaping every rank (victim: -9).
A *stopped* peer (gloo_stopped_rank.py) is what hangs. Needs torch (exit 2 without it).

Example::

    python tests/programs/gloo_dead_rank.py --world-size 3 --delay 0.5
"""

from __future__ import annotations

import signal

from _gloo import RankContext
from _gloo import launch
from _gloo import make_parser
from _util import log
from _util import signal_self


def rank_main(ctx: RankContext) -> None:
    """Join, warm up, then wait in all_reduce (peers) or die (the victim)."""
    dist = ctx.init_process_group()
    import torch

    tensor = torch.ones(1024)
    dist.all_reduce(tensor)  # warm-up: every pair connection is up and used
    if ctx.rank == ctx.options["victim"]:
        ctx.announce("SIGKILL after the go-ahead")
        signal_self(ctx.rank, ctx.go, ctx.options["delay"], signal.SIGKILL)
    ctx.announce("all_reduce")
    dist.all_reduce(tensor)
    log(f"[rank {ctx.rank}] all_reduce returned")


def main() -> None:
    """Parse arguments and launch every rank."""
    parser = make_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--victim", type=int, default=-1, help="rank that SIGKILLs itself (-1: last)")
    parser.add_argument("--delay", type=float, default=0.5, help="seconds between ready and the kill")
    args = parser.parse_args()
    options = {"victim": args.victim % args.world_size, "delay": args.delay}
    launch(args, rank_main, list(range(args.world_size)), options)


if __name__ == "__main__":
    main()
