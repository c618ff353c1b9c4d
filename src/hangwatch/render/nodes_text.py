"""A report across nodes as text: the nodes and their errors, the merged tree, who is missing, the cause.

From the model alone (``NodesReport``). The analysis keys processes by merge keys (node index x 10^7
+ pid); the text shows each node's own pid again, next to labels that already name the node.
"""

from __future__ import annotations

import re

from hangwatch.model.nodes import NodeOutcome
from hangwatch.model.nodes import NodesReport
from hangwatch.model.nodes import NodeSummary
from hangwatch.model.nodes import NodesWatchReport
from hangwatch.model.nodes import NodeWatchSummary
from hangwatch.model.nodes import ProcessKey
from hangwatch.model.nodes import RankCensus
from hangwatch.model.report import Verdict
from hangwatch.model.rulebook import statement_of
from hangwatch.render.stacktext import tree_lines
from hangwatch.words import plural

MAX_ERRORS_PER_NODE = 5
_KEY = re.compile(r"\b\d{8,}\b")


def nodes_text(report: NodesReport, max_tree_lines: int = 60) -> str:
    d = report.diagnosis
    ok = sum(1 for n in report.nodes if n.outcome is NodeOutcome.OK)
    out = [
        f"hangwatch stacks across {plural(len(report.nodes), 'node')} ({report.selector}): "
        f"{ok} answered, {len(report.nodes) - ok} failed"
    ]
    out += [f"  {line}" for n in report.nodes for line in node_lines(n)]
    out += [f"  note: {note}" for note in report.notes]
    out.append("")
    out += tree_lines(report.stack_tree, max_lines=max_tree_lines)
    out.append("")
    out += census_lines(report.ranks)
    confidence = f", {d.confidence} confidence" if d.confidence else ""
    out.append(f"cause: {d.cause.value}{confidence}")
    out.append(f"  {d.explanation}")
    if d.culprits:
        where = [(report.processes.get(k), k) for k in d.culprits]
        out.append("  culprits: " + ", ".join(f"pid {w.pid} on {w.node}" if w else str(k) for w, k in where))
    if d.decided_by:
        out.append(f"  decided by: {' > '.join(d.decided_by)} ({statement_of(d.decided_by[-1])})")
    if d.near_misses:
        out.append("  closest rules (what each lacked):")
        out.extend(f"    - {m.describe()}" for m in d.near_misses)
    if report.next_steps:
        out.append("next:")
        out.extend(f"  - {s}" for s in report.next_steps)
    return local_text("\n".join(out), report.processes)


def node_lines(n: NodeSummary) -> list[str]:
    if n.outcome is not NodeOutcome.OK:
        # "(auth)", not "auth: ...": the redactor masks whatever follows a secret-like name and a colon.
        return [f"{n.label}: no bundle ({n.outcome.value}) after {n.elapsed_s:.2f} s: {n.detail}"]
    skew = (
        f"clock skew {n.skew.offset_s - n.skew.bound_s:+.3f}..{n.skew.offset_s + n.skew.bound_s:+.3f} s"
        if n.skew
        else "clock skew unknown"
    )
    collect = f"collect {n.collect_s:.2f} s of {n.elapsed_s:.2f} s" if n.collect_s is not None else ""
    ranks = n.rank_label or "no ranks"
    processes = plural(n.processes, "process")
    lines = [f"{n.label} ({n.host}, pid ns {n.pid_ns}): {processes}, {ranks}; {skew}; {collect}"]
    lines += [f"  {what}: {text}" for what, text in (("gpus", n.gpus), ("probe", n.probe)) if text]
    lines += [
        f"  error ({e.stage}{f', pid {e.pid}' if e.pid else ''}): {e.detail}"
        for e in n.errors[:MAX_ERRORS_PER_NODE]
    ]
    if len(n.errors) > MAX_ERRORS_PER_NODE:
        lines.append(f"  ... {plural(len(n.errors) - MAX_ERRORS_PER_NODE, 'more error')}")
    return lines


def census_lines(c: RankCensus) -> list[str]:
    if not c.found and c.world_size is None:
        return []
    placed = "; ".join(f"{ranks} on {node}" for node, ranks in c.by_node)
    world = f"world size {c.world_size}" if c.world_size else "world size unknown"
    lines = [f"ranks: {world}; {len({r.rank for r in c.found})} checked in: {placed or 'none'}"]
    if c.missing:
        where = (
            f"not on any node that answered; {', '.join(c.silent_nodes)} did not answer and may hold them"
            if c.silent_nodes
            else "not found on any node"
        )
        lines.append(f"  missing: {c.missing_label} ({where})")
    if c.duplicated:
        lines.append(f"  found twice: {c.duplicated_label} (two jobs matched?)")
    return lines


def local_text(text: str, keys: dict[int, ProcessKey], *, with_node: bool = False) -> str:
    """Merge keys in a rendered text back to the node's own pids (labels already name the node);
    ``with_node``: as ``node:pid``, for texts whose names do not (the watch's evidence: ``python [n2:7]``)."""

    def back(m: re.Match[str]) -> str:
        key = keys.get(int(m.group(0)))
        if key is None:
            return m.group(0)
        return f"{key.node}:{key.pid}" if with_node else str(key.pid)

    return _KEY.sub(back, text)


def nodes_watch_text(report: NodesWatchReport, max_tree_lines: int = 40) -> str:
    """``attach --hosts``: the job's one verdict, where its culprits run, each node's rounds, the cost."""
    v = report.verdict
    out = [
        f"hangwatch attach across {plural(len(report.nodes), 'node')} ({report.selector}): {v.state.value} "
        f"after {report.duration_s:.0f} s",
        verdict_line(v),
        f"  {v.summary}",
    ]
    if v.culprits:
        where = [(report.processes.get(k), k) for k in v.culprits]
        out.append("  culprits: " + ", ".join(f"pid {w.pid} on {w.node}" if w else str(k) for w, k in where))
    out.append("nodes:")
    out += [f"  {watch_node_line(n)}" for n in report.nodes]
    out += [f"  note: {note}" for note in report.notes]
    if v.evidence:
        out.append("evidence:")
        # The evidence names processes by name and pid only ("python [7]"): say the node with the pid.
        out += [f"  - {local_text(e, report.processes, with_node=True)}" for e in v.evidence[:12]]
    if report.log_tail:
        out.append("last lines of the nodes' logs:")
        out += [f"  {line}" for line in report.log_tail[-8:]]
    if report.stack_tree is not None:
        out.append("")
        out += tree_lines(report.stack_tree, max_lines=max_tree_lines)
        out.append("")
    c = report.cost
    stacks = ""
    if c.stack_rounds:
        stacks = f"; {plural(c.stack_rounds, 'stack round')}, median {c.stack_median_s:.2f} s"
    out.append(
        f"census: {plural(c.rounds, 'round')} across the nodes, median {c.median_s:.2f} s "
        f"(max {c.max_s:.2f} s){stacks}"
    )
    if v.next_steps:
        out.append("next:")
        out.extend(f"  - {s}" for s in v.next_steps)
    # The culprits line already says each pid with its node: its pids are the nodes' own, under the
    # merge keys' 8 digits, so the mapping back leaves it as it is.
    return local_text("\n".join(out), report.processes)


def verdict_line(v: Verdict) -> str:
    """The verdict's first line as one machine's says it: ``hangwatch verdict: STALLED (cause:
    collective-wait, high confidence)``; the confidence is the cause's, so none without a cause."""
    confidence = f", {v.confidence} confidence" if v.confidence and v.cause else ""
    cause = f" (cause: {v.cause.value}{confidence})" if v.cause else ""
    return f"hangwatch verdict: {v.state.value.upper()}{cause}"


def watch_node_line(n: NodeWatchSummary) -> str:
    total = n.rounds_answered + n.rounds_failed
    head = f"{n.label}" + (f" ({n.host})" if n.host != n.label else "")
    line = (
        f"{head}: answered {n.rounds_answered} of {plural(total, 'round')}; "
        f"{plural(n.processes, 'process')} as last seen"
    )
    if n.silent_since_s is not None:
        # "(refused)", not "refused: ...": the redactor masks whatever follows a secret-like word and a colon.
        line += f"; silent since {n.silent_since_s:.1f} s ({n.last_outcome.value}): {n.last_detail}"
    return line
