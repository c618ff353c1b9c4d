"""The rulebook as the Markdown table docs/verdicts.md carries (scripts/rulebook_doc.py writes it there;
a test checks that the page and the table agree)."""

from __future__ import annotations

from collections.abc import Sequence

from hangwatch.model.rulebook import TABLES
from hangwatch.model.rulebook import RuleEntry

BEGIN = "<!-- rulebook: generated from hangwatch.model.rulebook by scripts/rulebook_doc.py; do not edit -->"
END = "<!-- end of the rulebook -->"


def rulebook_markdown(entries: Sequence[RuleEntry]) -> str:
    """One table per section, in the book's order (the order its rules are tried): id and requirement."""
    rows = [BEGIN]
    for table, where in TABLES:
        rows += ["", f"**{table}**: {where}.", "", "| # | rule | what it requires |", "|---|---|---|"]
        rows += [
            f"| {n} | `{e.id}` | {e.statement.replace('|', '/')} |"
            for n, e in enumerate((e for e in entries if e.table == table), start=1)
        ]
    return "\n".join([*rows, "", END])
