"""A report across nodes as text: the nodes and their errors, the merged tree, who is missing, the cause."""

from __future__ import annotations

from hangwatch.analyse import causes
from hangwatch.analyse.nodes import NodesAnalysis
from hangwatch.analyse.nodes import local_text
from hangwatch.analyse.nodes import outcome_counts
from hangwatch.analyse.stacktree import compact_ranges
from hangwatch.model.nodes import NodeOutcome
from hangwatch.model.nodes import NodeSummary
from hangwatch.model.nodes import RankCensus
from hangwatch.render.stacktext import tree_lines

MAX_ERRORS_PER_NODE = 5


def nodes_text(analysis: NodesAnalysis, selector: str, max_tree_lines: int = 60) -> str:
    merged, diagnosis = analysis.merged, analysis.diagnosis
    ok, failed = outcome_counts(merged.nodes)
    out = [f"hangwatch stacks across {len(merged.nodes)} nodes ({selector}): {ok} answered, {failed} failed"]
    out += [f"  {line}" for n in merged.nodes for line in node_lines(n)]
    out.append("")
    out += tree_lines(analysis.tree, max_lines=max_tree_lines)
    out.append("")
    out += census_lines(merged.census)
    confidence = f", {diagnosis.confidence} confidence" if diagnosis.confidence else ""
    out.append(f"cause: {diagnosis.cause.value}{confidence}")
    out.append(f"  {diagnosis.explanation}")
    if diagnosis.culprits:
        where = [merged.keys.get(k) for k in diagnosis.culprits]
        out.append(
            "  culprits: "
            + ", ".join(
                f"pid {w.pid} on {w.node}" if w else str(k)
                for w, k in zip(where, diagnosis.culprits, strict=True)
            )
        )
    steps = causes.NEXT_STEPS.get(diagnosis.cause, ())
    if steps:
        out.append("next:")
        out.extend(f"  - {s}" for s in steps)
    return local_text("\n".join(out), merged.keys)


def node_lines(n: NodeSummary) -> list[str]:
    if n.outcome is not NodeOutcome.OK:
        # "(auth)", not "auth: ...": the redactor masks whatever follows a secret-like name and a colon.
        return [f"{n.label}: no bundle ({n.outcome.value}) after {n.elapsed_s:.2f} s: {n.detail}"]
    ranks = compact_ranges(f"rank{r}" if r.isdigit() else r for r in n.ranks) or "no ranks"
    skew = (
        f"clock skew {n.skew.offset_s - n.skew.bound_s:+.3f}..{n.skew.offset_s + n.skew.bound_s:+.3f} s"
        if n.skew
        else "clock skew unknown"
    )
    collect = f"collect {n.collect_s:.2f} s of {n.elapsed_s:.2f} s" if n.collect_s is not None else ""
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
    by_node: dict[str, list[str]] = {}
    for r in c.found:
        by_node.setdefault(r.node, []).append(f"rank{r.rank}")
    placed = "; ".join(f"{compact_ranges(ranks)} on {node}" for node, ranks in by_node.items())
    world = f"world size {c.world_size}" if c.world_size else "world size unknown"
    lines = [f"ranks: {world}; {len({r.rank for r in c.found})} checked in: {placed or 'none'}"]
    if c.missing:
        missing = compact_ranges(f"rank{r}" for r in c.missing)
        where = (
            f"not on any node that answered; {', '.join(c.silent_nodes)} did not answer and may hold them"
            if c.silent_nodes
            else "not found on any node"
        )
        lines.append(f"  missing: {missing} ({where})")
    if c.duplicated:
        lines.append(f"  found twice: {compact_ranges(f'rank{r}' for r in c.duplicated)} (two jobs matched?)")
    return lines
