"""A torchrun worker script whose job hangs in a collective: every rank joins the gloo group from
torchrun's environment (its agent hosts the TCPStore, listening on ``--master-port``), then each rank but
the last enters ``all_reduce`` while the last sleeps forever in ``rank_busy_elsewhere``. A real stall
with a listening port in the tree: the store's port is no server waiting for work.

``READY_DIR/rankR`` is written (atomically) just before the call each rank blocks in. Needs torch.

``--steps N``: every rank first runs N all-reduces together (the job's healthy part). ``--self-dump-after
S``: S seconds into the hang each rank writes its own Flight Recorder (the pickle torch's NCCL group
writes when its dump pipe is poked) to ``$TORCH_FR_DUMP_TEMP_FILE<rank>``: gloo keeps the recorder but has
no pipe, so the ranks stand in for NCCL's trigger; the dump itself is torch's.

Example::

    torchrun --nnodes 1 --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 29500 \\
        tests/programs/torchrun_hang.py --ready-dir /tmp/r
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from datetime import timedelta
from pathlib import Path

from _util import log
from _util import require_torch
from _util import write_ready


def rank_busy_elsewhere() -> None:
    """Where the last rank is instead of the collective: a plain sleep, forever."""
    while True:
        time.sleep(3600)


def dump_recorder(rank: int, after_s: float) -> None:
    """This rank's Flight Recorder, as torch dumps it, where the dump pipe would have it written."""
    time.sleep(after_s)
    from torch._C._distributed_c10d import _dump_fr_trace

    target = Path(f"{os.environ['TORCH_FR_DUMP_TEMP_FILE']}{rank}")
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(_dump_fr_trace(True, True, False))
    tmp.replace(target)
    log(f"[rank {rank}] Flight Recorder dumped to {target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ready-dir", required=True, help="where each rank writes rankR before it blocks")
    parser.add_argument("--steps", type=int, default=0, help="all-reduces every rank runs first")
    parser.add_argument("--self-dump-after", type=float, metavar="S", help="dump the recorder S s in")
    args = parser.parse_args()
    dist = require_torch()
    # A long group timeout: the waiting ranks block instead of erroring.
    dist.init_process_group("gloo", timeout=timedelta(hours=1))
    import torch

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    for _ in range(args.steps):
        dist.all_reduce(torch.ones(16))
    if args.self_dump_after is not None:
        threading.Thread(target=dump_recorder, args=(rank, args.self_dump_after), daemon=True).start()
    ready = str(Path(args.ready_dir) / f"rank{rank}")
    if rank == world - 1:
        log(f"[rank {rank}] entering rank_busy_elsewhere")
        write_ready(ready)
        rank_busy_elsewhere()
    log(f"[rank {rank}] entering all_reduce")
    write_ready(ready)
    dist.all_reduce(torch.ones(1024))
    log(f"[rank {rank}] all_reduce returned")


if __name__ == "__main__":
    main()
