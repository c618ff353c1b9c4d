"""Phase history in words: a run report's ``history:`` block (text and Markdown), and the listing of
``hangwatch history``.

"cuda_graph: 95 s (usual 60-70 s, 5 boots): longer than usual". The block's lines are indented as the
verdict's other blocks (render/text.py); the range is drawn as ``model.history.USUAL_RULE`` says.
"""

from __future__ import annotations

import datetime as dt

from hangwatch.model.history import HistoryComparison
from hangwatch.model.history import HistoryListing
from hangwatch.model.history import PhaseHistory
from hangwatch.model.history import PhaseHistoryLine
from hangwatch.model.history import Standing
from hangwatch.model.report import Report
from hangwatch.redact import scrub
from hangwatch.words import plural

_STANDING = {Standing.LONGER: "longer than usual", Standing.SHORTER: "shorter than usual"}


def seconds(value: float) -> str:
    """``41 s``; under ten seconds with a decimal (``2.5 s``): short phases are timed to the tick."""
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def when(iso: str) -> str:
    """``2025-01-02 12:00 UTC`` of a report's ISO 8601 start (UTC); as it is where it is not one."""
    try:
        stamp = dt.datetime.fromisoformat(iso)
    except ValueError:
        return iso
    if stamp.tzinfo is not None:
        stamp = stamp.astimezone(dt.UTC)
    return stamp.strftime("%Y-%m-%d %H:%M UTC")


def usual_range(h: PhaseHistory) -> str:
    """``usual 22-25 s, 5 boots`` (``usual 22 s, 1 boot`` when the range is one value)."""
    lo, hi = seconds(h.lo_s), seconds(h.hi_s)
    span = lo if lo == hi else f"{lo.removesuffix(' s')}-{hi}"
    return f"usual {span}, {plural(h.boots, 'boot')}"


def phase_line(line: PhaseHistoryLine) -> str:
    """``weights: 41 s (usual 22-25 s, 5 boots): longer than usual``."""
    took = seconds(line.duration_s) + ("" if line.finished else " and not finished")
    text = f"{line.phase}: {took} ({usual_range(line.usual)})"
    word = _STANDING.get(line.standing)
    return f"{text}: {word}" if word else text


def _standing_words(h: HistoryComparison) -> str:
    earlier = (
        f"{plural(h.earlier_boots, 'earlier boot')} of this configuration"
        if h.earlier_boots
        else "the first boot of this configuration"
    )
    recorded = "recorded" if h.recorded else "not recorded (no phase finished)"
    return f"{earlier}, {recorded}"


def headline(h: HistoryComparison) -> str:
    """``history: 5 earlier boots of this configuration, recorded (id 3fa2c1d0e4b5: vllm 0.11.0 · ...)``."""
    return f"history: {_standing_words(h)} (id {h.key_id}: {h.key.describe()})"


def history_lines(report: Report) -> list[str]:
    """The verdict's ``history:`` block, indented as its other blocks; empty where history is off."""
    h = report.phase_history
    if h is None:
        return []
    lines = [f"  {headline(h)}"]
    lines.extend(f"    - {phase_line(line)}" for line in h.lines)
    if h.earlier_boots and not h.lines:
        lines.append("    - none of those boots ran the phases of this one")
    return [scrub(line) for line in lines]


def history_markdown(report: Report) -> list[str]:
    """The same for the Markdown report: a paragraph and a list. The configuration (a model path the user
    typed) goes into a code span with its backticks taken out, as render/markdown.py does a command."""
    h = report.phase_history
    if h is None:
        return []
    config = " ".join(scrub(h.key.describe()).replace("`", "").split())  # one code span, one line
    lines = ["", f"History: {_standing_words(h)} (id `{h.key_id}`: `{config}`)", ""]
    lines.extend(f"- `{line.phase}`{phase_line(line).removeprefix(line.phase)}" for line in h.lines)
    return [scrub(line) for line in lines]


def listing_text(listing: HistoryListing) -> str:
    """``hangwatch history``: each configuration, its boots and each phase's usual range."""
    configs = listing.configurations
    lines = [f"hangwatch history: {plural(len(configs), 'configuration')} in {listing.path}"]
    if not configs:
        lines.append("  none yet: every `hangwatch run` records the phases of its boot")
    else:
        lines.append(f"  usual: {listing.rule}")
    for c in configs:
        lines += ["", f"{c.key_id}  {c.key.describe()}"]
        lines.append(f"  {plural(c.boots, 'boot')}, {when(c.first_at)} to {when(c.last_at)}")
        for p in c.phases:
            last = f"; last {seconds(p.last_s)}" if p.last_s is not None else ""
            lines.append(f"  - {p.phase}: {usual_range(p)}{last}")
    if configs:
        lines += ["", "Forget one with: hangwatch history --forget ID"]
    lines.extend(f"note: {n}" for n in listing.notes)
    return scrub("\n".join(lines))
