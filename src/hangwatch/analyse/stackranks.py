"""How processes are named in the merged stacks: rank labels (``TP1``, ``rank3``, ``role[pid]``), and which
processes are peers (ranks whose stacks are compared). Labels compacted into ranges are ``ranges``'."""

from __future__ import annotations

import re
from collections.abc import Iterable

from hangwatch.model.stacks import ProcessStacks

_TITLE_RANK = re.compile(r"(?:^|[_:.\-])(?:rank|r)[_-]?(\d+)$", re.IGNORECASE)
_UNTITLED = re.compile(r"^(?:python[\d.]*|python\d?-\w+)$")


def rank_label(p: ProcessStacks) -> str:
    """How a process is named in rank ranges: ``TP1``, ``rank3``; else ``role[pid]``.

    The rank comes from the engine profile (``VLLM::Worker_TP1``, ``RANK=3``); for programs that set
    neither, a title ending in ``rank3`` or ``:r3`` names it (``gloo_rank3``, ``dead_peer:r3``).
    """
    if p.rank:
        return f"rank{p.rank}" if p.rank.isdigit() else p.rank
    m = _TITLE_RANK.search(p.name)
    if m:
        return f"rank{int(m.group(1))}"
    return f"{p.role or p.name}[{p.pid}]"


def is_peer(p: ProcessStacks) -> bool:
    """A rank: one of several processes doing the same job, whose stacks are compared."""
    return names_a_rank(p.name, p.rank)


def names_a_rank(name: str, rank: str | None) -> bool:
    """The profile gave it a rank (``VLLM::Worker_TP1``, ``RANK=3``), or its title ends in one
    (``gloo_rank3``, ``dead_peer:r3``)."""
    return bool(rank) or _TITLE_RANK.search(name) is not None


# The kernel keeps 15 bytes of a process's title in comm, all a zombie still shows.
_COMM_BYTES = 15


def ended_rank(name: str, rank: str | None, ranked: set[str]) -> bool:
    """A process that ended was a rank: named one (``names_a_rank``), or its name is a rank's title cut to
    comm's 15 bytes (``VLLM::Worker_TP`` of ``VLLM::Worker_TP1``, among the ``ranked`` names seen): a rank
    that set its title after our last look and died shows only that, and its peers the rest."""
    if names_a_rank(name, rank):
        return True
    return len(name.encode()) == _COMM_BYTES and any(other.startswith(name) for other in ranked)


def peer_pids(processes: Iterable[ProcessStacks]) -> set[int]:
    """The ranks; when nothing names a rank, the largest group (2 or more) sharing one process title.

    Titles cut to 15 bytes lose the rank (``sglang::scheduler_TP3`` is ``sglang::schedul`` in comm
    without setproctitle), but the ranks still share their title, and the launcher does not.
    """
    processes = list(processes)
    ranked = {p.pid for p in processes if is_peer(p)}
    if len(ranked) >= 2:
        return ranked
    by_name: dict[str, set[int]] = {}
    for p in processes:
        if not _UNTITLED.match(p.name):  # two untitled interpreters (a launcher, a tracker) are no ranks
            by_name.setdefault(p.name, set()).add(p.pid)
    largest = max(by_name.values(), key=len, default=set())
    return largest if len(largest) >= 2 else ranked
