"""Launcher and rank plumbing shared by the ``gloo_*.py`` programs (torch CPU build with gloo).

The launcher (the script's main process) checks that torch imports (else exit 2), picks a port, starts
one ``spawn`` process per rank and waits until every started rank has *announced* the blocking call it
is about to make (``[rank R] entering WHAT``). Then it prints the rank pids, writes ``--ready-file`` and
sets the ``go`` event (for ranks that must act only after the handshake, e.g. kill themselves), and
finally ``join()``s every rank, exiting with the first non-zero rank exit status.

Ranks join a gloo process group through ``tcp://127.0.0.1:PORT`` with a long timeout (default one hour)
so that a missing peer makes them block instead of erroring quickly. Each rank names itself
``gloo_rankR`` (setproctitle when installed, else /proc/PID/comm) and dies with its launcher
(PR_SET_PDEATHSIG), so a hand-run program leaves nothing behind.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

from _util import add_ready_file_arg
from _util import die_with_parent
from _util import log
from _util import require_torch
from _util import set_title
from _util import write_ready


@dataclass
class RankContext:
    """What a rank function gets: its coordinates and the handshake channels."""

    rank: int
    world_size: int
    port: int
    timeout_s: float
    options: dict[str, Any]
    status: Queue[tuple[int, str]]
    go: Event

    def announce(self, what: str) -> None:
        """Tell the launcher (and the log) which blocking call this rank enters next."""
        log(f"[rank {self.rank}] entering {what}")
        self.status.put((self.rank, what))

    def init_process_group(self) -> Any:
        """Join the gloo group on 127.0.0.1:port with the long timeout; returns torch.distributed."""
        dist = require_torch()
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{self.port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=self.timeout_s),
        )
        log(f"[rank {self.rank}] init_process_group done (world size {self.world_size})")
        return dist


RankFunction = Callable[[RankContext], None]


def make_parser(description: str) -> argparse.ArgumentParser:
    """The options every gloo program takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--world-size", type=int, default=2, help="number of ranks in the group")
    parser.add_argument("--port", type=int, default=0, help="rendezvous port on 127.0.0.1 (0: pick one)")
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=3600.0,
        help="process-group timeout; the default hour makes a hang a hang",
    )
    add_ready_file_arg(parser)
    return parser


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_entry(target: RankFunction, ctx: RankContext) -> None:
    die_with_parent()
    set_title(f"gloo_rank{ctx.rank}")
    # Loopback only: the hostname may resolve to an interface gloo cannot use in a container.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    target(ctx)


def launch(
    args: argparse.Namespace, target: RankFunction, ranks: list[int], options: dict[str, Any] | None = None
) -> None:
    """Start ``ranks`` (a subset of the world when a rank is meant to be missing), handshake, join."""
    require_torch()  # exit 2 here, before any rank starts, when torch is missing
    port = args.port or _free_port()
    ctx = mp.get_context("spawn")
    status: Queue[tuple[int, str]] = ctx.Queue()
    go = ctx.Event()
    contexts = [
        RankContext(rank, args.world_size, port, args.timeout_s, options or {}, status, go) for rank in ranks
    ]
    procs = {
        c.rank: ctx.Process(target=_rank_entry, args=(target, c), name=f"rank{c.rank}") for c in contexts
    }
    for proc in procs.values():
        proc.start()
    log(f"launcher: world size {args.world_size}, started ranks {ranks} on port {port}")

    entered: dict[int, str] = {}
    while len(entered) < len(procs):
        try:
            rank, what = status.get(timeout=0.5)
        except queue.Empty:
            dead = {r: p.exitcode for r, p in procs.items() if p.exitcode is not None}
            if dead:
                log(f"launcher: ranks died before the handshake: {dead}")
                sys.exit(1)
            continue
        entered[rank] = what
    log("launcher: " + ", ".join(f"rank{r}={p.pid} in {entered[r]}" for r, p in procs.items()))
    write_ready(args.ready_file)
    go.set()

    exit_status = 0
    for rank, proc in procs.items():
        proc.join()
        log(f"launcher: rank {rank} exited with {proc.exitcode}")
        if proc.exitcode and not exit_status:
            exit_status = 1
    sys.exit(exit_status)
