"""The rulebook as the Markdown table docs/verdicts.md carries (scripts/rulebook_doc.py writes it there;
a test checks that the page and the table agree)."""

from __future__ import annotations

from collections.abc import Sequence

from hangwatch.model.rulebook import RuleEntry

BEGIN = "<!-- rulebook: generated from hangwatch.model.rulebook by scripts/rulebook_doc.py; do not edit -->"
END = "<!-- end of the rulebook -->"


def rulebook_markdown(entries: Sequence[RuleEntry]) -> str:
    """One row per rule, in the book's order: its id and what it requires."""
    rows = [BEGIN, "", "| rule | what it requires |", "|---|---|"]
    rows += [f"| `{e.id}` | {e.statement.replace('|', '/')} |" for e in entries]
    return "\n".join([*rows, "", END])
