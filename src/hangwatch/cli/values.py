"""The types of numeric options, every command's: a finite number in its bounds, or one line that says
what to give. Apart from ``cli.options`` (which imports the analysis for its defaults), so that
``hangwatch collect``, started on every node of a fan-out, imports only what it runs."""

from __future__ import annotations

import math
from collections.abc import Callable

from hangwatch.errors import UsageError


def number(
    flag: str, unit: str = "seconds", *, zero_ok: bool = False, no_limit: bool = False, example: str = "30"
) -> Callable[[str], float | None]:
    """The type of a numeric option (every duration: --stall-after, --timeout, --grace, --window, ...).

    A finite number, more than 0 (``zero_ok``: 0 or more); ``nan``, ``inf``, negatives and words are
    refused with one line. ``no_limit``: the option means "no limit" when left out, and ``inf`` says
    the same (None).
    """
    least = "0 or more" if zero_ok else "more than 0"
    of_unit = f" of {unit}" if unit else ""

    def parse(text: str) -> float | None:
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"{flag} {text!r}: not a number{of_unit}; give e.g. {flag} {example}") from None
        if math.isinf(value) and value > 0 and no_limit:
            return None
        if not math.isfinite(value):
            hint = f" (leave {flag} out for no limit)" if no_limit else ""
            raise UsageError(f"{flag} {text}: give a finite number{of_unit}{hint}")
        if value < 0 or (value == 0 and not zero_ok):
            raise UsageError(f"{flag} {text}: must be {least}" + (f" {unit}" if unit else ""))
        return value

    return parse


def seconds(flag: str, *, zero_ok: bool = False, no_limit: bool = False) -> Callable[[str], float | None]:
    return number(flag, "seconds", zero_ok=zero_ok, no_limit=no_limit)
