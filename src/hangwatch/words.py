"""Small helpers for the words hangwatch prints: counts with their nouns ("1 process", "2 processes"), sizes
("512 MiB", "1.5 GiB")."""

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


_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(n: float | None, smallest: str = "B", largest: str = "TiB") -> str:
    """``n`` bytes in the largest unit from ``smallest`` to ``largest`` that keeps it under 1024 (or
    ``largest``): the smallest unit whole, the larger ones with one decimal. ``human_bytes(3 << 20)`` is
    "3.0 MiB", ``human_bytes(3 << 20, "MiB")`` "3 MiB", ``human_bytes(3 << 30, "MiB", "MiB")`` "3072 MiB";
    None is "?"."""
    if n is None:
        return "?"
    first, last = _UNITS.index(smallest), _UNITS.index(largest)
    value = n / 1024**first
    for unit in _UNITS[first:last]:
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == smallest else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.0f} {largest}" if largest == smallest else f"{value:.1f} {largest}"
