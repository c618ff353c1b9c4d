"""One node's share of a torchrun-style gloo job: an agent that starts this node's ranks, as torchrun does.

Run once per (emulated) node. The agent starts one worker process per ``--ranks`` entry with
torchrun's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``, ``TORCHELASTIC_RUN_ID``) and waits for them. Workers set no process
title (torchrun's do not): their rank is in their environment only. They join one process group with
``init_method="env://"``: rank 0 hosts the TCPStore at ``MASTER_ADDR:MASTER_PORT``, on whichever node
runs it. The group timeout is one hour, so a missing peer makes the others block, not error.

``--culprit R``: rank R never joins the all_reduce the others enter (it sleeps in
``rank_busy_elsewhere``). Without a culprit every rank enters the all_reduce; a rank of the world that
no node starts leaves the others blocked in the rendezvous (``init_process_group``). Each worker writes
``READY_DIR/rankR`` (atomically) just before the call it blocks in. ``--job NAME`` only labels the
command line, so a test can select one job among several. Needs torch (exit 2 without it).

Example (one node)::

    python tests/programs/gloo_node_job.py --ranks 0,1 --world-size 2 --master-addr 127.0.0.1 \
        --master-port 29555 --ready-dir /tmp/r
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from _util import die_with_parent
from _util import log
from _util import require_torch
from _util import write_ready


def rank_busy_elsewhere() -> None:
    """Where the culprit is instead of the collective: a plain sleep, forever."""
    while True:
        time.sleep(3600)


def worker(args: argparse.Namespace) -> None:
    """One rank: join the group (env://), then the all_reduce, or go elsewhere as the culprit."""
    die_with_parent()
    dist = require_torch()
    rank = int(os.environ["RANK"])
    ready = str(Path(args.ready_dir) / f"rank{rank}")
    if args.culprit is None:
        # Without a culprit this run is about the rendezvous: say so before blocking in it.
        write_ready(ready, "init_process_group\n")
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(hours=1))
    log(f"[rank {rank}] init_process_group done")
    import torch

    if rank == args.culprit:
        write_ready(ready, "rank_busy_elsewhere\n")
        rank_busy_elsewhere()
    if args.culprit is not None:
        write_ready(ready, "all_reduce\n")
    tensor = torch.ones(16)
    dist.all_reduce(tensor)
    log(f"[rank {rank}] all_reduce returned {tensor[0].item()}")


def agent(args: argparse.Namespace) -> None:
    """torchrun's part on one node: start the local ranks with its environment, wait for them."""
    # Named apart from its workers, as torchrun's agent is (comm "torchrun" vs "python"): a child with
    # its parent's name is taken for a helper of the parent, not a rank.
    # Only comm (prctl PR_SET_NAME), not setproctitle: the command line stays as given, to be matched.
    ctypes.CDLL(ctypes.util.find_library("c")).prctl(15, b"gloo_node_agent", 0, 0, 0)
    ranks = [int(r) for r in args.ranks.split(",") if r]
    children = []
    for local, rank in enumerate(ranks):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(local),
            "WORLD_SIZE": str(args.world_size),
            "LOCAL_WORLD_SIZE": str(len(ranks)),
            "GROUP_RANK": str(args.node_rank),
            "MASTER_ADDR": args.master_addr,
            "MASTER_PORT": str(args.master_port),
            "TORCHELASTIC_RUN_ID": args.job,
        }
        argv = [sys.executable, __file__, *sys.argv[1:], "--worker"]
        children.append(subprocess.Popen(argv, env=env))
    log(f"agent: node rank {args.node_rank}, ranks {ranks}: pids {[c.pid for c in children]}")
    status = 0
    for child in children:
        status = status or child.wait()
    sys.exit(1 if status else 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--job", default="job", help="a label in the command line")
    parser.add_argument("--ranks", required=True, help="this node's global ranks: 0,1")
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--master-addr", required=True)
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--culprit", type=int, help="this rank never enters the all_reduce")
    parser.add_argument("--ready-dir", required=True)
    args = parser.parse_args()
    if args.worker:
        worker(args)
    else:
        agent(args)


if __name__ == "__main__":
    main()
