"""A rank SIGSTOPs itself while its peers wait for it in ``all_reduce``: everyone blocks.

``--world-size`` ranks (default 2) form a gloo group and do one warm-up all_reduce. Then every rank but
``--victim`` (default the last) enters a second all_reduce, and the victim waits for the launcher's
go-ahead (given after ``--ready-file`` is written), sleeps ``--delay`` seconds and sends itself SIGSTOP.

What really happens (torch 2.13.0 CPU): the victim's sockets stay open, so gloo sees nothing wrong and
the peers wait in all_reduce (state S, ~0 % CPU) until the group timeout, one hour by default. With
``--timeout-s 5`` they raise after exactly that long: ``RuntimeError: [.../gloo/transport/tcp/
unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation to complete``. A SIGCONT lets the
victim run on into the all_reduce, which then completes. Needs torch (exit 2 without it).

Example::

    python tests/programs/gloo_stopped_rank.py --delay 0.5
"""

from __future__ import annotations

import signal

from _gloo import RankContext
from _gloo import launch
from _gloo import make_parser
from _util import log
from _util import signal_self


def rank_main(ctx: RankContext) -> None:
    """Join, warm up, then wait in all_reduce (peers) or stop (the victim, which joins after SIGCONT)."""
    dist = ctx.init_process_group()
    import torch

    tensor = torch.ones(1024)
    dist.all_reduce(tensor)  # warm-up: every pair connection is up and used
    if ctx.rank == ctx.options["victim"]:
        ctx.announce("SIGSTOP after the go-ahead")
        signal_self(ctx.rank, ctx.go, ctx.options["delay"], signal.SIGSTOP)
        log(f"[rank {ctx.rank}] continued")
    else:
        ctx.announce("all_reduce")
    dist.all_reduce(tensor)
    log(f"[rank {ctx.rank}] all_reduce returned")


def main() -> None:
    """Parse arguments and launch every rank."""
    parser = make_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--victim", type=int, default=-1, help="rank that SIGSTOPs itself (-1: last)")
    parser.add_argument("--delay", type=float, default=0.5, help="seconds between ready and the stop")
    args = parser.parse_args()
    options = {"victim": args.victim % args.world_size, "delay": args.delay}
    launch(args, rank_main, list(range(args.world_size)), options)


if __name__ == "__main__":
    main()
