"""A report across nodes as text: the nodes and their errors, the merged tree, who is missing, the cause.

From the model alone (``NodesReport``). The analysis keys processes by merge keys (node index x 10^7
+ pid); the text shows each node's own pid again, next to labels that already name the node.
"""

from __future__ import annotations

import re

from hangwatch.model.nodes import NodeOutcome
from hangwatch.model.nodes import NodesReport
from hangwatch.model.nodes import NodeSummary
from hangwatch.model.nodes import ProcessKey
from hangwatch.model.nodes import RankCensus
from hangwatch.render.stacktext import tree_lines

MAX_ERRORS_PER_NODE = 5
_KEY = re.compile(r"\b\d{8,}\b")


def nodes_text(report: NodesReport, max_tree_lines: int = 60) -> str:
    d = report.diagnosis
    ok = sum(1 for n in report.nodes if n.outcome is NodeOutcome.OK)
    out = [
        f"hangwatch stacks across {len(report.nodes)} nodes ({report.selector}): "
        f"{ok} answered, {len(report.nodes) - ok} failed"
    ]
    out += [f"  {line}" for n in report.nodes for line in node_lines(n)]
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
    lines = [f"{n.label} ({n.host}, pid ns {n.pid_ns}): {n.processes} processes, {ranks}; {skew}; {collect}"]
    lines += [
        f"  error ({e.stage}{f', pid {e.pid}' if e.pid else ''}): {e.detail}"
        for e in n.errors[:MAX_ERRORS_PER_NODE]
    ]
    if len(n.errors) > MAX_ERRORS_PER_NODE:
        lines.append(f"  ... {len(n.errors) - MAX_ERRORS_PER_NODE} more errors")
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


def local_text(text: str, keys: dict[int, ProcessKey]) -> str:
    """Merge keys in a rendered text back to the node's own pids (labels already name the node)."""

    def back(m: re.Match[str]) -> str:
        key = keys.get(int(m.group(0)))
        return str(key.pid) if key is not None else m.group(0)

    return _KEY.sub(back, text)
