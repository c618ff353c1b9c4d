"""The final verdict as text for a terminal."""

from __future__ import annotations

from collections.abc import Callable

from hangwatch.model.report import Report
from hangwatch.model.rulebook import statement_of
from hangwatch.model.vocabulary import State
from hangwatch.redact import scrub
from hangwatch.render.history_text import history_lines
from hangwatch.render.stacktext import tree_lines

_HEADLINE = {
    State.READY: "READY",
    State.STALLED: "STALLED",
    State.CRASHED: "CRASHED",
    State.EXITED: "EXITED",
    State.TIMEOUT: "TIMEOUT",
    State.INTERRUPTED: "INTERRUPTED",
}

# What a run's output.log is: every byte the tree printed, so what the reports mask is there in clear;
# hangwatch creates it 0600 (collect/logtail.open_private_log).
RAW_LOG_NOTE = "the raw output, not redacted: mode 0600, readable by you only"


def culprit_labels(report: Report, quote: Callable[[str], str] = str) -> list[str]:
    """Each culprit as "name [pid] role/rank" (what is known of it), its words passed through ``quote``."""
    by_pid = {p.pid: p for p in report.processes}
    labels = []
    for pid in report.verdict.culprits:
        p = by_pid.get(pid)
        if p is None:
            labels.append(f"[{pid}]")
        else:
            labels.append(f"{quote(p.name)} [{pid}]" + (f" {quote(f'{p.role}/{p.rank}')}" if p.rank else ""))
    return labels


def _headline(report: Report) -> str:
    v = report.verdict
    confidence = f", {v.confidence} confidence" if v.confidence and v.cause else ""
    return f"hangwatch verdict: {_HEADLINE[v.state]}" + (
        f" (cause: {v.cause.value}{confidence})" if v.cause else ""
    )


def recap_text(report: Report, said_at: float) -> str:
    """The verdict at the end of ``run --keep-running`` when it is the stall said in full at ``said_at``
    (the block above): its headline, what was done to the tree since, the notes, the log; the diagnosis is
    not said twice."""
    lines = [_headline(report), f"  as said at {said_at:.1f} s above (the whole verdict: the reports)"]
    if report.tree_action:
        lines.append(f"  tree: {report.tree_action}")
    return scrub("\n".join(lines + _notes_and_log(report)))


def verdict_text(report: Report) -> str:
    v = report.verdict
    lines = [_headline(report), f"  {v.summary}"]
    if v.phase:
        lines.append(f"  phase: {v.phase}")
    if v.culprits:
        lines.append(f"  culprits: {', '.join(culprit_labels(report))}")
    if v.decided_by:
        lines.append(f"  decided by: {' > '.join(v.decided_by)} ({statement_of(v.decided_by[-1])})")
    if v.near_misses:
        lines.append("  closest rules (what each lacked):")
        lines.extend(f"    - {m.describe()}" for m in v.near_misses)
    if v.evidence:
        lines.append("  evidence:")
        lines.extend(f"    - {e}" for e in v.evidence)
    if report.stack_tree is not None:
        lines.extend("  " + line for line in tree_lines(report.stack_tree, max_lines=16))
    if report.tree_action:
        lines.append(f"  tree: {report.tree_action}")
    if v.next_steps:
        lines.append("  next:")
        lines.extend(f"    - {s}" for s in v.next_steps)
    lines.extend(history_lines(report))
    return scrub("\n".join(lines + _notes_and_log(report)))


def _notes_and_log(report: Report) -> list[str]:
    """The block's last lines: the notes, then where the log is."""
    lines = []
    if report.notes:
        lines.append("  notes:")
        lines.extend(f"    - {n}" for n in report.notes)
    if report.log_path:
        # A run's log is the tree's output as it came, secrets included: say who can read it (only its
        # owner: collect/logtail.LOG_MODE). attach's is the server's own file, whatever its mode.
        private = f" ({RAW_LOG_NOTE})" if report.mode == "run" else ""
        lines.append(f"  log: {report.log_path}{private}")
    return lines
