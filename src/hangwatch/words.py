"""Small helpers for the words hangwatch prints: counts with their nouns ("1 process", "2 processes")."""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` and ``noun`` (its last word made plural unless count is 1): ``plural(1, "process")`` is
    "1 process", ``plural(4, "PCIe GPU")`` "4 PCIe GPUs"; ``many`` for an irregular plural."""
    if count == 1:
        return f"{count} {noun}"
    if many is not None:
        return f"{count} {many}"
    ending = "es" if noun.endswith(("s", "x", "ch", "sh")) else "s"
    return f"{count} {noun}{ending}"
