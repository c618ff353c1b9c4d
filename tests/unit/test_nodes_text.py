"""The report across nodes as text at scale: 1,000 nodes are a few lines, not 1,000; a few nodes are a line
each, as before; a node that failed or has errors is always its own line."""

from __future__ import annotations

from dataclasses import replace

from hangwatch.model.nodes import BundleError
from hangwatch.model.nodes import ClockSkew
from hangwatch.model.nodes import NodeOutcome
from hangwatch.model.nodes import NodeSummary
from hangwatch.model.nodes import NodeWatchSummary
from hangwatch.model.nodes import RankCensus
from hangwatch.model.nodes import RankPlace
from hangwatch.ranges import host_list
from hangwatch.render.nodes_text import MAX_NODE_LINES
from hangwatch.render.nodes_text import census_lines
from hangwatch.render.nodes_text import nodes_lines
from hangwatch.render.nodes_text import watch_node_line
from hangwatch.render.nodes_text import watch_nodes_lines


def _node(
    i: int, per: int = 10, gpus: str = "8 GPUs: util 0-3 %, 608.0 GiB used", **changes: object
) -> NodeSummary:
    ranks = tuple(str(i * per + r) for r in range(per))
    node = NodeSummary(
        label=f"node{i}",
        host=f"node{i}",
        outcome=NodeOutcome.OK,
        detail="",
        pid_ns=4026531836,
        processes=per,
        ranks=ranks,
        rank_label=f"rank{i * per}-{i * per + per - 1}",
        skew=ClockSkew(offset_s=0.01 * (i % 7), bound_s=0.1),
        elapsed_s=1.5 + 0.001 * i,
        collect_s=1.2,
        gpus=gpus,
    )
    return NodeSummary(**{**node.__dict__, **changes})


def test_a_thousand_nodes_are_a_few_lines_and_the_odd_nodes_their_own():
    nodes = [_node(i) for i in range(1000)]
    nodes[17] = _node(17, gpus="8 GPUs: util 100 %, 608.0 GiB used")  # one node's GPUs busy
    nodes[500] = _node(500, errors=(BundleError("stacks", "py-spy timed out", 5012),))
    nodes[999] = NodeSummary(
        "node999", "node999", NodeOutcome.TIMEOUT, "no answer", None, 0, (), "", None, 30.0, None
    )
    lines = nodes_lines(nodes)
    assert len(lines) < 10, lines
    first = lines[0]
    assert first.startswith(
        "node[0-499,501-998]: 998 nodes answered: 9980 processes (10 each), rank0-4999,rank5010-9989;"
    )
    assert "clock skew -0.100..+0.160 s" in first and "collect 1.20 s of 1.50-2.50 s" in first
    # The GPU readings, each with the nodes that gave it, the most common first.
    assert lines[1] == "  gpus: 8 GPUs: util 0-3 %, 608.0 GiB used (997 nodes: node[0-16,18-499,501-998])"
    assert lines[2] == "  gpus: 8 GPUs: util 100 %, 608.0 GiB used (1 node: node17)"
    # The node with an error and the node that did not answer: their own lines, as with a few nodes.
    assert any(line.startswith("node500 (node500") for line in lines)
    assert any("error (stacks, pid 5012): py-spy timed out" in line for line in lines)
    assert lines[-1].startswith("node999: no bundle (timeout)")


def test_a_few_nodes_are_a_line_each():
    nodes = [_node(i) for i in range(MAX_NODE_LINES)]
    lines = nodes_lines(nodes)
    assert [line for line in lines if not line.startswith("  ")] == [
        line for n in nodes for line in nodes_lines([n]) if not line.startswith("  ")
    ]
    assert sum(1 for line in lines if not line.startswith("  ")) == MAX_NODE_LINES


def test_readings_past_the_few_most_common_are_counted():
    nodes = [_node(i, gpus=f"8 GPUs: util {i % 6} %, 1.0 GiB used") for i in range(60)]
    lines = nodes_lines(nodes)
    readings = [line for line in lines if line.startswith("  gpus:")]
    assert len(readings) == 4
    assert readings[-1] == "  gpus: ... 30 more nodes, other readings (the JSON has each)"


def test_the_census_of_many_nodes_folds_its_ranks_over_host_lists():
    found = tuple(
        RankPlace(r, f"node{r // 10}", 1, 1000 + r % 10, (r // 10 + 1) * 10_000_000 + r % 10, "")
        for r in range(10_000)
        if r != 1042
    )
    census = RankCensus(10_000, found, (1042,), (), (), by_node=tuple((f"node{i}", "") for i in range(1000)))
    (line, *_) = census_lines(census)
    assert line == (
        "ranks: world size 10000; 9999 checked in: node[0-104]:rank0-1041,node[104-999]:rank1043-9999"
    )
    few = RankCensus(4, found[:4], (), (), (), by_node=(("node0", "rank0-3"),))
    assert census_lines(few)[0] == "ranks: world size 4; 4 checked in: rank0-3 on node0"


def test_host_lists_fold_as_slurm_writes_them():
    assert host_list(f"node{i}" for i in range(1000)) == "node[0-999]"
    assert host_list(["gpu01", "gpu02", "gpu04", "login", "gpu03"]) == "gpu[01-04],login"
    assert host_list(["a"]) == "a"
    assert host_list([]) == ""


def test_a_watch_of_many_nodes_folds_those_that_answered_every_round():
    nodes = [
        NodeWatchSummary(f"gpu{i:03d}", f"gpu{i:03d}", 1, 20, 0, NodeOutcome.OK, "", None, 9)
        for i in range(64)
    ]
    nodes[7] = NodeWatchSummary("gpu007", "gpu007", 1, 12, 8, NodeOutcome.REFUSED, "refused", 14.5, 0)
    nodes[9] = replace(nodes[9], rounds_answered=19, rounds_failed=1)  # one round lost, answering again
    lines = watch_nodes_lines(nodes)
    assert lines[0] == (
        "gpu[000-006,008,010-063]: 62 nodes answered every round (20); 558 processes as last seen (9 each)"
    )
    assert lines[1].startswith(
        "gpu007: answered 12 of 20 rounds; 0 processes as last seen; silent since 14.5 s"
    )
    assert lines[2].startswith("gpu009: answered 19 of 20 rounds")
    assert len(lines) == 3
    few = nodes[:MAX_NODE_LINES]
    assert watch_nodes_lines(few) == [watch_node_line(n) for n in few]
