"""What torch's Flight Recorder said of each rank's process groups at a stall (issue 26).

The recorder is a ring buffer of each rank's collectives that torch.distributed keeps in the rank itself
(``TORCH_FR_BUFFER_SIZE``); NCCL's process group dumps it when a byte is written to its dump pipe, and the
process keeps running. Each group's status names the last collective enqueued, started and completed: over
every rank of a group, who never reached the collective the others wait in is a desync, said exactly.
docs/flight-recorder.md has the mechanism and what it cannot see.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GroupStatus:
    """One process group as one rank's recorder saw it (sequence numbers count the group's collectives)."""

    pg: str  # the group's id in the dump ("0" for the default group)
    desc: str  # "default_pg", or a name the program gave
    ranks: tuple[int, ...]  # its members' global ranks, when the dump lists them
    last_enqueued: int  # -1 when none
    last_started: int  # -1 when the backend does not track it (gloo)
    last_completed: int
    # The collective each sequence number was, where the buffer still holds it: seq -> "nccl:all_reduce".
    ops: tuple[tuple[int, str], ...] = ()

    def op(self, seq: int) -> str | None:
        return dict(self.ops).get(seq)


@dataclass(frozen=True)
class RankDump:
    """One rank's dump: whose, and its groups."""

    rank: int
    pid: int | None  # the process that wrote it, where the tree shows one of that rank
    groups: tuple[GroupStatus, ...]
    version: str  # the dump format's version ("2.10")


@dataclass(frozen=True)
class FlightCapture:
    """The dumps read at one stall, and the ranks that gave none (with why)."""

    dumps: tuple[RankDump, ...]
    missing: tuple[tuple[int, str], ...] = ()  # (rank, why)
    triggered: int = 0  # pipes written to
    elapsed_s: float = 0.0  # from the first write to the last dump read
