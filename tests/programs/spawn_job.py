"""Ranks under ``torch.multiprocessing.spawn`` (no titles, no RANK in the environment: only the launcher
knows who is who), each joining a gloo group and running one all_reduce, with one of three shapes:

``--shape kill``    rank ``--victim`` SIGKILLs itself before the all_reduce; mp.spawn's parent notices,
                    terminates the others and raises ``ProcessExitedException``: the killed rank is the
                    cause, the launcher's exception its consequence.
``--shape loader``  rank ``--victim`` waits in ``queue.Queue.get`` for a prefetch batch from its own loader
                    thread, which is stuck (an ``Event`` nobody sets); the others wait in the all_reduce.
                    A wait only its own threads can end: not "waiting for work".
``--shape work``    rank ``--victim`` builds tables for ``--seconds`` first (CPU, allocating, no log), the
                    others wait in the all_reduce for it; then every rank finishes and the job exits 0.

Example::

    python tests/programs/spawn_job.py --shape loader --world-size 2
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import socket
import threading
import time
from datetime import timedelta

from _util import log
from _util import require_torch
from work_loops import work


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_main(rank: int, world: int, port: int, shape: str, victim: int, seconds: float) -> None:
    dist = require_torch()
    import torch

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(hours=1)
    )
    log(f"[rank {rank}] joined")
    if rank == victim:
        if shape == "kill":
            time.sleep(2.0)
            log(f"[rank {rank}] sending SIGKILL to myself")
            os.kill(os.getpid(), signal.SIGKILL)
        elif shape == "loader":
            batches: queue.Queue[int] = queue.Queue(maxsize=2)
            stuck = threading.Event()

            def loader() -> None:
                stuck.wait()  # a prefetch that never comes (a stuck read, a lock held elsewhere)
                batches.put(1)

            threading.Thread(target=loader, name="prefetch", daemon=True).start()
            log(f"[rank {rank}] waiting for the first batch")
            batches.get()
        else:
            work("cycle", seconds, rank)
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    log(f"[rank {rank}] all_reduce done")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=("kill", "loader", "work"), required=True)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--victim", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=20.0, help="--shape work: how long the rank works")
    args = parser.parse_args()
    require_torch()
    import torch.multiprocessing as tmp

    port = _free_port()
    log(f"launcher: {args.world_size} ranks, shape {args.shape}")
    tmp.spawn(
        rank_main, args=(args.world_size, port, args.shape, args.victim, args.seconds), nprocs=args.world_size
    )
    log("launcher: done")


if __name__ == "__main__":
    main()
