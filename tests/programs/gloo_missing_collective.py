"""A collective that one rank never joins: the others wait in all_reduce, the culprit is elsewhere.

``--world-size`` ranks (default 2) form a gloo group. Every rank except ``--culprit`` (default the
last) calls ``dist.all_reduce`` on a small tensor; the culprit instead sleeps forever in a function
named ``rank_busy_elsewhere``, or with ``--elsewhere``:

- ``read-own-pipe``: in a bare read of a pipe only it could write (``rank_reading_its_own_pipe``);
- ``retry-log``: in a retry loop that logs ``still waiting ... (attempt N, waited S s)`` every 2 s;
- ``exit0`` / ``os-exit``: it leaves 1 s after the handshake, ``sys.exit(0)`` or ``os._exit(3)`` (no
  traceback): the waiters' gloo then raises "Connection closed by peer" and the launcher exits 1.

``--waiters-in store``: the others first wait for a key of the group's store (served by rank 0 itself)
that only the culprit would set, a wait the culprit's going away does not end.

With the one-hour group timeout nobody errors: the waiters block in
gloo (state S, ~0 % CPU), the culprit sleeps in ``time.sleep``. ``--ready-file`` is written once every
rank has announced the call it enters. Needs torch (exit 2 without it).

Example::

    python tests/programs/gloo_missing_collective.py --world-size 4 --culprit 2
"""

from __future__ import annotations

import os
import sys
import time

from _gloo import RankContext
from _gloo import launch
from _gloo import make_parser


def rank_busy_elsewhere() -> None:
    """Where the culprit is instead of the collective: a plain sleep, forever."""
    while True:
        time.sleep(3600)


def rank_reading_its_own_pipe() -> None:
    """Elsewhere with no Python wait at all: a bare read of a pipe whose write end only this process
    holds. Its innermost frame looks like a receive, yet no message can come."""
    read_end, _write_end = os.pipe()
    os.read(read_end, 1)


def rank_retrying(rank: int) -> None:
    """A wait that logs: the same words every 2 s, only its counts new."""
    attempt = 0
    while True:
        attempt += 1
        print(
            f"[rank {rank}] still waiting for 127.0.0.1:9 (attempt {attempt}, waited {2 * attempt} s)",
            flush=True,
        )
        time.sleep(2)


def rank_leaving(ctx: RankContext, how: str) -> None:
    """Leave the group after the handshake, without a word: cleanly or with an error status."""
    ctx.go.wait()
    time.sleep(1.0)
    if how == "exit0":
        sys.exit(0)
    os._exit(3)


def rank_main(ctx: RankContext) -> None:
    """Join the group, then either enter all_reduce or go elsewhere (the culprit)."""
    dist = ctx.init_process_group()
    import torch

    if ctx.rank == ctx.options["culprit"]:
        elsewhere = ctx.options["elsewhere"]
        if elsewhere == "read-own-pipe":
            ctx.announce("rank_reading_its_own_pipe")
            rank_reading_its_own_pipe()
        if elsewhere == "retry-log":
            ctx.announce("rank_retrying")
            rank_retrying(ctx.rank)
        if elsewhere in {"exit0", "os-exit"}:
            ctx.announce("rank_leaving")
            rank_leaving(ctx, elsewhere)
        ctx.announce("rank_busy_elsewhere")
        rank_busy_elsewhere()
    if ctx.options["waiters_in"] == "store":
        # A wait that no peer's going away can end: the group's store, served by rank 0 itself.
        from torch.distributed.distributed_c10d import _get_default_store

        ctx.announce("store_wait")
        _get_default_store().wait([f"rank{ctx.options['culprit']}-done"])
    ctx.announce("all_reduce")
    tensor = torch.ones(1024)
    dist.all_reduce(tensor)
    print(f"[rank {ctx.rank}] all_reduce returned {tensor[0].item()}", flush=True)


def main() -> None:
    """Parse arguments and launch every rank."""
    parser = make_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--culprit", type=int, default=-1, help="rank that skips the collective (-1: last)")
    parser.add_argument(
        "--waiters-in",
        choices=("all_reduce", "store"),
        default="all_reduce",
        help="where the others wait first: the collective, or a key of the group's store that only the "
        "culprit would set (a wait that does not end when the culprit's sockets close)",
    )
    parser.add_argument(
        "--elsewhere",
        choices=("sleep", "read-own-pipe", "retry-log", "exit0", "os-exit"),
        default="sleep",
        help="where the culprit is instead: a sleep, a read of a pipe only it could write, a retry loop "
        "that logs, or gone (exit 0, or os._exit(3))",
    )
    args = parser.parse_args()
    culprit = args.culprit % args.world_size
    options = {"culprit": culprit, "elsewhere": args.elsewhere, "waiters_in": args.waiters_in}
    launch(args, rank_main, list(range(args.world_size)), options)


if __name__ == "__main__":
    main()
