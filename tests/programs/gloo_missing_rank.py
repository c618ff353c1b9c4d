"""A gloo group whose last rank never starts: the others block in init_process_group (rendezvous).

Only ``--world-size`` - 1 ranks are started (ranks 0 .. N-2; default world size 2, so rank 0 alone).
Each announces ``init_process_group`` and calls it: rank 0 hosts the TCP store and waits for the
missing rank to check in, the others wait on rank 0; with the one-hour timeout they block instead of
erroring (state S, ~0 % CPU). ``--ready-file`` is written once every started rank has announced the
call. Needs torch (exit 2 without it).

Example::

    python tests/programs/gloo_missing_rank.py --world-size 3
"""

from __future__ import annotations

from _gloo import RankContext
from _gloo import launch
from _gloo import make_parser


def rank_main(ctx: RankContext) -> None:
    """Try to join a group one member short."""
    ctx.announce("init_process_group")
    ctx.init_process_group()  # never returns: rank N-1 does not exist


def main() -> None:
    """Parse arguments and launch all ranks but the last."""
    parser = make_parser(__doc__.split("\n\n")[0])
    args = parser.parse_args()
    if args.world_size < 2:
        parser.error("--world-size must be at least 2 (one rank is left out)")
    launch(args, rank_main, list(range(args.world_size - 1)))


if __name__ == "__main__":
    main()
