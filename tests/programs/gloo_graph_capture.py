"""A rank stuck inside CUDA graph capture while its peers wait in ``dist.barrier()``.

``--world-size`` ranks (default 2) form a gloo group. Rank ``--culprit`` (default 0) runs
``CudaGraphRunner.capture()`` from ``cuda_graph_runner.py`` in this folder, which prints a few
``Capturing batches (bs=N ...)`` lines and then blocks forever at ``--hang-at-bs``; every other rank has
"finished" and waits in ``dist.barrier()`` for it. With the one-hour timeout nothing errors.
``--ready-file`` is written once every rank has announced its call. Needs torch (exit 2 without it).

Example::

    python tests/programs/gloo_graph_capture.py --world-size 4 --culprit 3
"""

from __future__ import annotations

from _gloo import RankContext
from _gloo import launch
from _gloo import make_parser
from _util import log
from cuda_graph_runner import CudaGraphRunner

BATCH_SIZES = [1, 2, 4, 8, 16, 32]


def rank_main(ctx: RankContext) -> None:
    """Join the group; the culprit captures (and hangs), the others wait at the barrier."""
    dist = ctx.init_process_group()
    log(f"[rank {ctx.rank}] Capture cuda graph begin. This can take up to several minutes.")
    if ctx.rank == ctx.options["culprit"]:
        ctx.announce("CudaGraphRunner.capture")
        CudaGraphRunner(BATCH_SIZES, ctx.options["hang_at_bs"], log).capture()
    ctx.announce("barrier")
    dist.barrier()
    log(f"[rank {ctx.rank}] Capture cuda graph end.")


def main() -> None:
    """Parse arguments and launch every rank."""
    parser = make_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--culprit", type=int, default=0, help="rank whose capture hangs")
    parser.add_argument(
        "--hang-at-bs",
        type=int,
        default=8,
        choices=BATCH_SIZES,
        help="batch size whose capture never finishes",
    )
    args = parser.parse_args()
    options = {"culprit": args.culprit % args.world_size, "hang_at_bs": args.hang_at_bs}
    launch(args, rank_main, list(range(args.world_size)), options)


if __name__ == "__main__":
    main()
