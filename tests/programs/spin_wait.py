"""Ranks that wait for a peer by spinning, in code whose names no rule knows: CPU burns, nothing moves.

The launcher starts ``--ranks`` ranks (default 2, ``spawn``), each titled ``spin_wait:rR``. Rank
``--culprit`` (default 1) never arrives: it blocks in a plain ``threading.Event().wait()`` (state S,
0 % CPU). Every other rank busy-polls a shared flag the culprit would set, in a Python loop of its own
(``--native`` instead polls inside ``ctypes``/libc: ``memcmp`` in a loop, the way a custom all-reduce
polls a flag from C), at 100 % of a core for as long as the wait lasts. No log line, no I/O. This is
the vLLM CPU build's TP=2 warm-up collective waiting for a rank that never comes, without its names.

``--ready-file`` is written once every spinner spins. With ``--release-after S`` the culprit sets the
flag after S seconds and every rank exits 0 (a slow peer, not a hang).

Example::

    python tests/programs/spin_wait.py --ranks 3 --culprit 2
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import threading
import time
from multiprocessing.queues import Queue

from _ranks import spawn_ranks
from _util import add_ready_file_arg
from _util import die_with_parent
from _util import log
from _util import set_title
from _util import write_ready


def poll_flag(flag: ctypes.c_int) -> None:
    """Spin until the flag is set: the loop a rank waits in, at 100 % of a core."""
    while not flag.value:
        pass


def poll_flag_native(flag: ctypes.c_int) -> None:
    """Spin in C: compare the flag's bytes with libc's memcmp until they change."""
    libc = ctypes.CDLL(None)
    libc.memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)  # 64-bit addresses
    zero = ctypes.c_int(0)
    address = ctypes.addressof(flag)
    while libc.memcmp(address, ctypes.addressof(zero), ctypes.sizeof(zero)) == 0:
        pass


def rank_main(
    rank: int, culprit: int, native: bool, release_after: float | None, flag: ctypes.c_int, up: Queue[int]
) -> None:
    set_title(f"spin_wait:r{rank}")
    die_with_parent()
    up.put(rank)
    if rank == culprit:
        if release_after is None:
            threading.Event().wait()  # never arrives
        time.sleep(release_after or 0.0)
        flag.value = 1
        return
    (poll_flag_native if native else poll_flag)(flag)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="number of rank processes")
    parser.add_argument("--culprit", type=int, default=1, help="the rank that never arrives")
    parser.add_argument("--native", action="store_true", help="spin in C (libc memcmp) instead of Python")
    parser.add_argument("--release-after", type=float, help="the culprit arrives after this many seconds")
    add_ready_file_arg(parser)
    args = parser.parse_args()
    if args.ranks < 2 or not 0 <= args.culprit < args.ranks:
        parser.error("--ranks must be >= 2 and --culprit a rank in [0, --ranks)")
    ctx = mp.get_context("spawn")
    flag = ctx.Value("i", 0, lock=False)  # a plain shared int: polling it runs no Python frame
    up: Queue[int] = ctx.Queue()
    ranks = spawn_ranks(
        ctx, args.ranks, rank_main, lambda r: (r, args.culprit, args.native, args.release_after, flag, up), up
    )
    log(f"launcher: {args.ranks} ranks up; rank {args.culprit} will not arrive")
    time.sleep(0.5)  # every spinner is inside its loop
    write_ready(args.ready_file)
    for proc in ranks:
        proc.join()
    log("launcher: every rank arrived")


if __name__ == "__main__":
    main()
