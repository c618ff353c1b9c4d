"""The report as one self-contained HTML page: verdict, evidence, timeline, merged stack tree.

Nothing is fetched (no script, font or stylesheet from anywhere): the page works offline and can be
attached to an issue. Jinja2 autoescaping escapes every value; free text that came from the server
(log lines in the evidence, source lines in frames, notes) is redacted again here as well.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from jinja2 import Environment
from jinja2 import PackageLoader
from jinja2 import select_autoescape
from markupsafe import Markup
from markupsafe import escape

from hangwatch import __version__
from hangwatch.model.report import ProcessRecord
from hangwatch.model.report import Report
from hangwatch.model.rulebook import statement_of
from hangwatch.model.stacks import StackNode
from hangwatch.redact import scrub
from hangwatch.render.files import write_atomically
from hangwatch.render.history_text import headline
from hangwatch.render.history_text import phase_line
from hangwatch.render.stacktext import chain_text
from hangwatch.render.stacktext import fold
from hangwatch.render.timeline_svg import rank_key
from hangwatch.render.timeline_svg import timeline_svg
from hangwatch.words import plural

_BACKTICKS = re.compile(r"`([^`]+)`")
MAX_TREE_NODES = 400  # deeper or wider trees are cut, with a note; the JSON report has everything


def get_environment() -> Environment:
    env = Environment(
        loader=PackageLoader("hangwatch", "render/templates"),
        autoescape=select_autoescape(["html", "j2"], default_for_string=True, default=True),
        keep_trailing_newline=True,
    )
    env.filters["code_spans"] = code_spans
    env.filters["plural"] = plural
    return env


def code_spans(text: str) -> Markup:
    """Escape ``text``, then show its `backticked` parts as code (our tags around escaped text only)."""
    escaped = str(escape(text))
    return Markup(_BACKTICKS.sub(r"<code>\1</code>", escaped))  # noqa: S704 - the text was escaped first


def _tree(node: StackNode, samples: int, budget: list[int]) -> dict[str, Any]:
    """A node for the template, single-member chains folded into one row as in the terminal."""
    budget[0] -= 1
    chain = fold(node)
    last = chain[-1]
    moved = None
    if last.ends and samples >= 2:
        moved = "unchanged" if last.unchanged == last.ends else f"moved ({last.ends - last.unchanged})"
    children = [_tree(c, samples, budget) for c in last.children if budget[0] > 0]
    return {
        "label": last.label,
        "text": scrub(chain_text(chain, keep=4)),
        "frames": [scrub(n.describe()) for n in chain],
        "threads": last.threads,
        "minority": last.minority,
        "moved": moved,
        "children": children,
        "cut": len(last.children) - len(children),
    }


def _row_order(p: ProcessRecord) -> tuple[object, ...]:
    """The timeline's order: ranks in rank order, then the others as they appeared."""
    return (rank_key(p.rank), p.first_seen, p.pid)


def _history(report: Report) -> tuple[str, list[str]] | None:
    """The phase history's headline and one line a phase (render/history_text.py), as text."""
    h = report.phase_history
    if h is None:
        return None
    return scrub(headline(h)), [scrub(phase_line(line)) for line in h.lines]


def _process_row(p: ProcessRecord) -> dict[str, Any]:
    """The state and exit code at the verdict (not the ``gone``/``-15`` of our own clean-up's SIGTERM),
    and what the clean-up did, apart."""
    state = p.verdict_state if p.verdict_state is not None else p.state
    ended_before = p.verdict_state is None or p.verdict_state == "gone"
    return {
        "pid": p.pid,
        "name": p.name,
        "role": p.role,
        "rank": p.rank,
        "state": state,
        "exit": "" if p.exit_code is None or not ended_before else p.exit_code,
        "cleanup": p.cleanup or "",
        "first_seen": p.first_seen,
        "last_seen": p.last_seen,
    }


def html_report(report: Report) -> str:
    v = report.verdict
    by_pid = {p.pid: p for p in report.processes}
    culprits = []
    for pid in v.culprits:
        p = by_pid.get(pid)
        culprits.append(f"{p.name} [{pid}]" + (f" rank {p.rank}" if p.rank else "") if p else f"[{pid}]")
    tree = report.stack_tree
    budget = [MAX_TREE_NODES]
    roots = [_tree(r, tree.samples, budget) for r in tree.roots] if tree is not None else []
    context = {
        "version": __version__,
        "report": report,
        "verdict": v,
        "summary": scrub(v.summary),
        "culprits": culprits,
        "decided_by": [(r, statement_of(r)) for r in v.decided_by],
        "near_misses": [(m.rule, scrub(m.lacked)) for m in v.near_misses],
        "evidence": [scrub(e) for e in v.evidence],
        "notes": [scrub(n) for n in report.notes],
        "history": _history(report),
        "command": scrub(" ".join(report.command)),
        "tree_action": scrub(report.tree_action) if report.tree_action else None,
        "timeline": Markup(timeline_svg(report)),  # noqa: S704 - built from escaped parts in timeline_svg
        "tree": tree,
        "tree_summary": scrub(tree.summary) if tree is not None else "",
        "roots": roots,
        "tree_cut": budget[0] <= 0,
        "processes": [_process_row(p) for p in sorted(report.processes, key=_row_order)],
        "cleaned": any(p.cleanup for p in report.processes),
        "captures": [
            {"t": s.t, "elapsed": s.elapsed_s, "processes": len(s.processes), "dumped": len(s.dumped)}
            for s in report.stacks
        ],
    }
    page = get_environment().get_template("report.html.j2").render(**context)
    return scrub(page)  # every field, the process table and the timeline included


def write_html(report: Report, path: Path) -> None:
    write_atomically(path, html_report(report))
