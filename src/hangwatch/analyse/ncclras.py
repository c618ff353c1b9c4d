"""What two readings of NCCL's RAS service a few seconds apart say of a stall (issue 26).

Per communicator, each rank's collective counts: frozen between the readings and equal across the ranks
is every rank stuck in the same collective (a kernel or a host that does not come back); frozen and
spread is a real mismatch (the ranks that ran fewer are behind); moving is progress the other signals
missed. Ranks RAS cannot reach are missing (dead, or never started); a rank whose status carries an
error or an abort says so.
"""

from __future__ import annotations

from hangwatch.model.ncclras import RasCommunicator
from hangwatch.model.ncclras import RasSnapshot
from hangwatch.ranges import rank_words as _ranks

RULE = "stall:nccl-ras"


def ras_findings(first: RasSnapshot, second: RasSnapshot) -> tuple[str, ...]:
    """One line per communicator that says something, in the order RAS lists them."""
    before = {c.hash: c for c in first.communicators}
    lines = []
    for c in second.communicators:
        said = _communicator(before.get(c.hash), c, second.t - first.t)
        if said:
            lines.append(f"NCCL RAS, communicator {c.hash[-6:]} ({c.size} ranks): {said}")
    return tuple(lines)


def _communicator(old: RasCommunicator | None, c: RasCommunicator, gap_s: float) -> str:
    words = []
    if c.missing:
        words.append(f"{_ranks(c.missing)} unreachable (dead, or never started)")
    for r in c.ranks:
        if r.errors:
            words.append(f"rank {r.rank} {', '.join(r.errors)}")
    if old is None or c.size <= 1:
        # One rank alone runs no collective through NCCL's kernels (its counts stay 0: NCCL 2.28.9 on an
        # H100): nothing to compare.
        return "; ".join(words)
    then = {r.rank: r.total for r in old.ranks}
    moved = [r.rank for r in c.ranks if r.rank in then and r.total != then[r.rank]]
    if moved:
        words.append(f"{_ranks(tuple(moved))} ran collectives in the {gap_s:.0f} s between two readings")
        return "; ".join(words)
    totals = {r.rank: r.total for r in c.ranks}
    if totals and len(set(totals.values())) == 1:
        n = next(iter(totals.values()))
        words.append(
            f"every rank read has run {n} collectives and none ran one in {gap_s:.0f} s: all are stuck in "
            "the same one (a kernel or a host that does not come back)"
        )
    elif totals:
        top = max(totals.values())
        behind = tuple(sorted(r for r, n in totals.items() if n < top))
        lows = sorted({totals[r] for r in behind})
        words.append(
            f"frozen, and spread: {_ranks(behind)} ran fewer collectives ({', '.join(map(str, lows))} "
            f"against {top}), so the others wait in one they never entered"
        )
    return "; ".join(words)
