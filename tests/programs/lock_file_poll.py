"""A rank that polls for a file lock before its collective, as ``filelock`` and compile caches do.

``--world-size`` ranks (default 2) form a gloo group. Rank ``--poller`` (default the last) must hold
``--lock PATH`` (``flock``, exclusive) before it joins the all_reduce: it tries ``LOCK_EX | LOCK_NB`` and
sleeps ``--interval`` seconds between tries (filelock's default poll is 0.05 s), the others wait in
``dist.all_reduce`` for it. Whoever holds the lock meanwhile (another build, an earlier run's leftover)
decides when the job goes on: while it holds it, the poller's wait can end any moment, never a wait
nothing can end. Once the lock is taken every rank finishes its all_reduce and the launcher exits 0.

``--hold PATH --seconds S`` is the other side: a process that takes the lock, prints ``holding PATH``,
holds it for ``S`` seconds (forever with 0) and exits, releasing it (a build outside the tree).

Example::

    python tests/programs/lock_file_poll.py --hold /tmp/x.lock --seconds 60 &
    python tests/programs/lock_file_poll.py --lock /tmp/x.lock
"""

from __future__ import annotations

import fcntl
import os
import time

from _gloo import RankContext
from _gloo import launch
from _gloo import make_parser
from _util import log
from _util import write_ready


def take_lock(path: str, interval: float) -> int:
    """Poll for the lock: a non-blocking try, then a sleep, until it is ours (the fd is returned)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            time.sleep(interval)


def rank_main(ctx: RankContext) -> None:
    dist = ctx.init_process_group()
    import torch

    if ctx.rank == ctx.options["poller"]:
        ctx.announce(f"polling for {ctx.options['lock']}")
        fd = take_lock(ctx.options["lock"], ctx.options["interval"])
        log(f"[rank {ctx.rank}] took {ctx.options['lock']}")
    else:
        ctx.announce("all_reduce")
        fd = None
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    log(f"[rank {ctx.rank}] all_reduce done: {tensor.tolist()}")
    if fd is not None:
        os.close(fd)
    dist.destroy_process_group()


def hold(path: str, seconds: float, ready_file: str | None) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    log(f"holding {path}")
    write_ready(ready_file)
    end = time.monotonic() + seconds if seconds > 0 else float("inf")
    while time.monotonic() < end:
        time.sleep(min(1.0, max(0.0, end - time.monotonic())))
    os.close(fd)
    log(f"released {path}")


def main() -> None:
    parser = make_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--lock", help="the lock file the poller needs")
    parser.add_argument("--poller", type=int, default=-1, help="the rank that polls (default: the last)")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between tries")
    parser.add_argument("--hold", metavar="PATH", help="be the holder instead: take PATH's lock and keep it")
    parser.add_argument("--seconds", type=float, default=0.0, help="with --hold: for this long (0: forever)")
    args = parser.parse_args()
    if args.hold:
        hold(args.hold, args.seconds, args.ready_file)
        return
    if not args.lock:
        parser.error("--lock PATH is required (or --hold PATH)")
    poller = args.poller if args.poller >= 0 else args.world_size - 1
    options = {"lock": args.lock, "poller": poller, "interval": args.interval}
    launch(args, rank_main, list(range(args.world_size)), options)


if __name__ == "__main__":
    main()
