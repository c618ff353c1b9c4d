"""How processes are named in the merged stacks: rank labels (``TP1``, ``rank3``, ``role[pid]``), which
processes are peers (ranks whose stacks are compared), and labels compacted into ranges (``TP0-6,TP7``)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from hangwatch.model.stacks import ProcessStacks

_TITLE_RANK = re.compile(r"(?:^|[_:.\-])(?:rank|r)[_-]?(\d+)$", re.IGNORECASE)
_NUMBERED = re.compile(r"^(.*?)(\d+)$")
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


def split_label(label: str) -> tuple[str, int | None]:
    """``TP3`` -> ("TP", 3); a label without a trailing number, or a ``role[pid]``, is itself, no number."""
    if label.isascii() and "\n" not in label:
        # _NUMBERED's answer without the regex (a third of the cost of labelling 10,000 ranks): on one
        # line of ASCII its digits are the trailing run of 0-9.
        stem = label.rstrip("0123456789")
        if stem == label or "[" in label:
            return label, None
        return stem, int(label[len(stem) :])
    m = _NUMBERED.match(label)
    if m and "[" not in label:
        return m.group(1), int(m.group(2))
    return label, None


def compact_ranges(labels: Iterable[str]) -> str:
    """``[TP0, TP1, TP2, TP4, rank1, main[7]]`` -> ``TP0-2,TP4,rank1,main[7]``."""
    numbered: dict[str, list[int]] = {}
    other: list[str] = []
    for label in dict.fromkeys(labels):
        prefix, number = split_label(label)
        if number is not None:
            numbered.setdefault(prefix, []).append(number)
        else:
            other.append(label)
    return ranges_text(numbered, other)


def ranges_text(numbered: dict[str, list[int]], other: list[str]) -> str:
    """``compact_ranges``' text from its labels split: the numbers under each prefix, and the rest."""
    parts: list[str] = []
    for prefix in sorted(numbered):
        parts.extend(_runs(prefix, sorted(numbered[prefix])))
    return ",".join(parts + sorted(other))


def rank_ranges(ranks: Iterable[int]) -> str:
    """``compact_ranges`` of ``rank<n>`` labels (n >= 0), from the numbers: no label built and split again."""
    numbers = sorted(set(ranks))
    return ",".join(_runs("rank", numbers)) if numbers else ""


def rank_words(ranks: Iterable[int]) -> str:
    """Global ranks in words: ``rank 3``, ``ranks 0-2,5``."""
    numbers = tuple(dict.fromkeys(ranks))
    text = compact_ranges(f"rank{r}" for r in numbers)
    return text.replace("rank", "ranks ", 1) if len(numbers) > 1 else text.replace("rank", "rank ", 1)


def _runs(prefix: str, numbers: list[int]) -> list[str]:
    out: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        out.append(f"{prefix}{start}" if start == prev else f"{prefix}{start}-{prev}")
        if n is not None:
            start = prev = n
    return out
