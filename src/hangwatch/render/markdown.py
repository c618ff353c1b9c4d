"""A short Markdown summary a person can paste into an engine's issue tracker.

Everything that came from the server (log lines, command lines, frames, source lines) goes into
fenced code blocks, redacted again, with any backtick run that could close the fence broken up; the
only Markdown outside the blocks is ours.
"""

from __future__ import annotations

import re
from pathlib import Path

from hangwatch.model.report import Report
from hangwatch.redact import scrub
from hangwatch.render.files import write_atomically
from hangwatch.render.history_text import history_markdown
from hangwatch.render.stacktext import tree_lines
from hangwatch.render.text import culprit_labels

_BACKTICKS = re.compile(r"`{3,}")
LOG_TAIL_LINES = 30


def _safe(text: str) -> str:
    """For a line inside a fenced block: no run of three backticks is left that could close it."""
    return _BACKTICKS.sub(lambda m: "\u200b".join(m.group(0)), scrub(text))


def _inline(text: str) -> str:
    """For text outside code blocks: no Markdown or HTML from the server gets interpreted (``&amp;`` stays
    those five characters: an entity would be decoded)."""
    out = scrub(text)
    for ch in ("\\", "&", "`", "*", "_", "[", "]", "<", ">", "#", "|"):
        out = out.replace(ch, "\\" + ch)
    return out


def markdown_report(report: Report) -> str:
    v = report.verdict
    cause = f" — cause `{v.cause.value}`" if v.cause else ""
    confidence = f" ({v.confidence} confidence)" if v.confidence and v.cause else ""
    lines = [f"### hangwatch: **{v.state.value.upper()}**{cause}{confidence}", ""]
    lines.append(_inline(v.summary))
    lines.append("")
    facts = [
        f"- engine profile: `{report.engine}`, mode `{report.mode}`, watched {report.duration_s:.0f} s "
        f"(started {report.started_at})",
    ]
    if v.phase:
        facts.append(f"- phase: {_inline(v.phase)}")
    if v.culprits:
        facts.append(f"- culprits: {', '.join(culprit_labels(report, _inline))}")
    if v.decided_by:
        facts.append(f"- decided by: {' > '.join(f'`{r}`' for r in v.decided_by)}")
    if v.near_misses:
        facts.append(
            "- closest rules: " + "; ".join(f"`{m.rule}` lacked {_inline(m.lacked)}" for m in v.near_misses)
        )
    if report.tree_action:
        facts.append(f"- tree: {_inline(report.tree_action)}")
    command = " ".join(report.command).replace("\n", " ").replace("`", "")  # one code span, unbreakable
    facts.append(f"- command: `{_safe(command)[:300]}`")
    lines.extend(facts)
    if report.environment:
        lines += ["", "Versions:", "", "```text"]
        width = max(len(k) for k in report.environment)
        lines.extend(_safe(f"{k + ':':<{width + 1}} {v}") for k, v in report.environment.items())
        lines.append("```")
    if report.log_tail:
        tail = report.log_tail[-LOG_TAIL_LINES:]
        where = f" of `{_safe(report.log_path).replace('`', '')}`" if report.log_path else ""
        count = "Last log line" if len(tail) == 1 else f"Last {len(tail)} log lines"
        lines += ["", f"{count}{where}:", "", "```text"]
        lines.extend(_safe(line) for line in tail)
        lines.append("```")
    if report.stack_tree is not None:
        lines += ["", "<details><summary>Stacks merged across ranks</summary>", "", "```text"]
        lines.extend(_safe(line) for line in tree_lines(report.stack_tree, max_lines=40, width=200))
        lines += ["```", "", "</details>"]
    if v.evidence:
        lines += ["", "Evidence:", "", "```text"]
        lines.extend(_safe(e) for e in v.evidence)
        lines.append("```")
    if v.next_steps:
        lines += ["", "Next steps:", ""]
        lines.extend(f"- {scrub(s)}" for s in v.next_steps)  # our own text, with its `commands`
    lines += history_markdown(report)
    if report.notes:
        lines += ["", "Notes:", ""]
        lines.extend(f"- {_inline(n)}" for n in report.notes)
    lines += ["", "_Report written by hangwatch._", ""]
    return scrub("\n".join(lines))  # and once more as a whole: nothing unredacted, whatever the field


def write_markdown(report: Report, path: Path) -> None:
    write_atomically(path, markdown_report(report))
