"""The rank harness of the test programs: ``spawn_ranks`` starts ranks and waits until each reported in
(``spin_wait.py`` too); the rest serves the programs whose one rank (the victim) does something to itself
while its peers wait for it: ``dead_peer.py`` (SIGKILL), ``self_stop.py`` (SIGSTOP).

The launcher starts ``--ranks`` ranks with the ``spawn`` start method; each names itself ``NAME:rR`` and
prints ``[rank R] init``. Once all ranks are up the launcher prints one line with their pids and writes
``--ready-file``; only then may the victim act (``Rank.act``), ``--delay`` seconds later. The peers wait
in ``Rank.mailbox.get()`` for a message from the victim. Standard library only.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import signal
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.context import SpawnContext
from multiprocessing.context import SpawnProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

from _util import add_ready_file_arg
from _util import log
from _util import set_title
from _util import signal_self
from _util import write_ready


@dataclass(frozen=True)
class Rank:
    """What one rank knows: who it is, who the victim is, and the launcher's queues."""

    rank: int
    ranks: int
    victim: int
    delay: float
    up: Queue[int]
    all_up: Event
    mailbox: Queue[str]

    @property
    def is_victim(self) -> bool:
        return self.rank == self.victim

    def report_in(self, name: str) -> None:
        set_title(f"{name}:r{self.rank}")
        log(f"[rank {self.rank}] init")
        self.up.put(self.rank)

    def act(self, sig: signal.Signals) -> None:
        """The victim, once the ready file is written and ``--delay`` has passed, sends itself ``sig``."""
        signal_self(self.rank, self.all_up, self.delay, sig)

    def wait_for_victim(self) -> str:
        log(f"[rank {self.rank}] waiting for rank {self.victim}")
        return self.mailbox.get()  # no timeout: blocks for as long as the victim does not send


def parse_args(description: str, does: str, delay_help: str) -> argparse.Namespace:
    """``--ranks``, ``--victim``, ``--delay`` and ``--ready-file``; ``does``: what the victim does."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--ranks", type=int, default=2, help="number of rank processes")
    parser.add_argument("--victim", type=int, default=1, help=f"the rank that {does}")
    parser.add_argument("--delay", type=float, default=1.0, help=delay_help)
    add_ready_file_arg(parser)
    args = parser.parse_args()
    if not 0 <= args.victim < args.ranks:
        parser.error("--victim must be a rank in [0, --ranks)")
    return args


def spawn_ranks(
    ctx: SpawnContext,
    count: int,
    target: Callable[..., None],
    args_of: Callable[[int], tuple[Any, ...]],
    up: Queue[int],
) -> list[SpawnProcess]:
    """Start ``count`` ranks (``target(*args_of(rank))``, named ``rankR``) and wait until each has put
    itself on ``up``."""
    ranks = [ctx.Process(target=target, args=args_of(r), name=f"rank{r}") for r in range(count)]
    for proc in ranks:
        proc.start()
    for _ in ranks:
        up.get()
    return ranks


def start_ranks(args: argparse.Namespace, rank_main: Callable[[Rank], None]) -> list[SpawnProcess]:
    """Start the ranks, wait until every one reported in, write the ready file and let the victim act."""
    ctx = mp.get_context("spawn")
    up: Queue[int] = ctx.Queue()
    mailbox: Queue[str] = ctx.Queue()
    all_up = ctx.Event()
    ranks = spawn_ranks(
        ctx,
        args.ranks,
        rank_main,
        lambda r: (Rank(r, args.ranks, args.victim, args.delay, up, all_up, mailbox),),
        up,
    )
    log(f"launcher: all {args.ranks} ranks up: " + ", ".join(f"rank{r}={p.pid}" for r, p in enumerate(ranks)))
    write_ready(args.ready_file)
    all_up.set()
    return ranks
