"""What NCCL's RAS service says of a job's communicators (NCCL 2.24 and later; issue 26).

Every NCCL process runs a small RAS thread; one on this node answers a client on ``localhost:28028`` (or
``NCCL_RAS_ADDR``) for the whole job: each communicator's ranks, their state, and per rank how many
collectives of each kind it has run. Read twice a few seconds apart at a stall, the counts say what kind
of stall it is (analyse/ncclras.py). docs/flight-recorder.md has the protocol and what it cannot see.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RasRank:
    rank: int
    host: str
    pid: int | None
    cuda_dev: int | None
    counts: tuple[tuple[str, int], ...]  # collective kind -> how many it ran ("AllReduce", 412)
    errors: tuple[str, ...]  # "async error 5", "abort flag", "destroyed": what its status says is wrong

    @property
    def total(self) -> int:
        return sum(n for _, n in self.counts)


@dataclass(frozen=True)
class RasCommunicator:
    hash: str
    size: int  # ranks the communicator has
    ranks: tuple[RasRank, ...]  # those RAS could read
    missing: tuple[int, ...]  # ranks it could not reach (dead, or never started)


@dataclass(frozen=True)
class RasSnapshot:
    t: float  # seconds on the watch's clock
    nccl_version: str
    communicators: tuple[RasCommunicator, ...]
    timeouts: int  # RAS's own: peers that did not answer it in time
