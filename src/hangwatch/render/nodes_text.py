"""A report across nodes as text: the nodes and their errors, the merged tree, who is missing, the cause.

From the model alone (``NodesReport``). The analysis keys processes by merge keys (node index x 10^7
+ pid); the text shows each node's own pid again, next to labels that already name the node.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from collections.abc import Sequence

from hangwatch.model.nodes import NodeOutcome
from hangwatch.model.nodes import NodesReport
from hangwatch.model.nodes import NodeSummary
from hangwatch.model.nodes import NodesWatchReport
from hangwatch.model.nodes import NodeWatchSummary
from hangwatch.model.nodes import ProcessKey
from hangwatch.model.nodes import RankCensus
from hangwatch.model.report import Verdict
from hangwatch.model.rulebook import statement_of
from hangwatch.ranges import compact_ranges
from hangwatch.ranges import host_list
from hangwatch.ranges import ranks_label
from hangwatch.render.stacktext import tree_lines
from hangwatch.words import plural

MAX_ERRORS_PER_NODE = 5
# Beyond this many nodes, those that answered without an error are one line (and their GPU and probe
# readings one line per distinct reading): 1,000 nodes are not 1,000 lines. The JSON report has each.
MAX_NODE_LINES = 12
MAX_READINGS = 3
_KEY = re.compile(r"\b\d{8,}\b")


def nodes_text(report: NodesReport, max_tree_lines: int = 60) -> str:
    d = report.diagnosis
    ok = sum(1 for n in report.nodes if n.outcome is NodeOutcome.OK)
    out = [
        f"hangwatch stacks across {plural(len(report.nodes), 'node')} ({report.selector}): "
        f"{ok} answered, {len(report.nodes) - ok} failed"
    ]
    out += [f"  {line}" for line in nodes_lines(report.nodes)]
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


def nodes_lines(nodes: Sequence[NodeSummary]) -> list[str]:
    """A line per node (and its readings and errors); past ``MAX_NODE_LINES`` nodes, those that answered
    without an error folded into one, the others each on their own, as ever."""
    plain = [n for n in nodes if n.outcome is NodeOutcome.OK and not n.errors]
    if len(nodes) <= MAX_NODE_LINES or len(plain) < 2:
        return [line for n in nodes for line in node_lines(n)]
    others = [line for n in nodes if n.outcome is not NodeOutcome.OK or n.errors for line in node_lines(n)]
    return [*folded_lines(plain), *others]


def folded_lines(nodes: Sequence[NodeSummary]) -> list[str]:
    """Nodes that answered without an error, as one: their host list, processes, ranks, skew, times."""
    processes = f"{plural(sum(n.processes for n in nodes), 'process')} ({_each(n.processes for n in nodes)})"
    rank_text = ranks_label(r for n in nodes for r in n.ranks) or "no ranks"
    skews = [n.skew for n in nodes if n.skew is not None]
    skew = (
        f"clock skew {min(k.offset_s - k.bound_s for k in skews):+.3f}.."
        f"{max(k.offset_s + k.bound_s for k in skews):+.3f} s"
        if skews
        else "clock skew unknown"
    )
    collects = [n.collect_s for n in nodes if n.collect_s is not None]
    elapsed = [n.elapsed_s for n in nodes]
    collect = f"collect {_span(collects)} s of {_span(elapsed)} s" if collects else ""
    times = "; ".join(part for part in (skew, collect) if part)
    hosts = host_list(n.label for n in nodes)
    lines = [f"{hosts}: {len(nodes)} nodes answered: {processes}, {rank_text}; {times}"]
    for what in ("gpus", "probe"):
        lines += [f"  {what}: {line}" for line in _readings(nodes, what)]
    return lines


def _each(values: Iterable[int]) -> str:
    """``10 each``, or ``8-10 each`` where they differ."""
    found = sorted(set(values))
    return f"{found[0]} each" if len(found) == 1 else f"{found[0]}-{found[-1]} each"


def _span(values: Sequence[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}"


def _readings(nodes: Sequence[NodeSummary], what: str) -> list[str]:
    """Each distinct reading with the nodes that gave it, the most common first, ``MAX_READINGS`` at most."""
    by_text: dict[str, list[str]] = {}
    for n in nodes:
        text = getattr(n, what)
        if text:
            by_text.setdefault(text, []).append(n.label)
    ranked = sorted(by_text.items(), key=lambda item: -len(item[1]))
    lines = [f"{text} ({plural(len(labels), 'node')}: {host_list(labels)})" for text, labels in ranked]
    if len(lines) > MAX_READINGS:
        hidden = sum(len(labels) for _, labels in ranked[MAX_READINGS:])
        lines = [
            *lines[:MAX_READINGS],
            f"... {plural(hidden, 'more node')}, other readings (the JSON has each)",
        ]
    return lines


def census_lines(c: RankCensus) -> list[str]:
    if not c.found and c.world_size is None:
        return []
    if len(c.by_node) > MAX_NODE_LINES:
        # Folded as the tree's labels are: runs of ranks across a host list (node[0-999]:rank0-9999).
        placed = compact_ranges(f"{r.node}:rank{r.rank}" for r in c.found)
    else:
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
    out += [f"  {line}" for line in watch_nodes_lines(report.nodes)]
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


def watch_nodes_lines(nodes: Sequence[NodeWatchSummary]) -> list[str]:
    """A line per node; past ``MAX_NODE_LINES`` nodes, those that answered every round as one line, the
    others (a round failed, silent at the end) each on their own."""
    steady = [n for n in nodes if not n.rounds_failed and n.silent_since_s is None]
    if len(nodes) <= MAX_NODE_LINES or len(steady) < 2:
        return [watch_node_line(n) for n in nodes]
    rounds = sorted({n.rounds_answered for n in steady})
    answered = f"{rounds[0]}" if len(rounds) == 1 else f"{rounds[0]}-{rounds[-1]}"
    folded = (
        f"{host_list(n.label for n in steady)}: {len(steady)} nodes answered every round ({answered}); "
        f"{plural(sum(n.processes for n in steady), 'process')} as last seen "
        f"({_each(n.processes for n in steady)})"
    )
    return [folded, *(watch_node_line(n) for n in nodes if n.rounds_failed or n.silent_since_s is not None)]


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
