"""The world a job expects, from its launcher's command line, and what of it never came.

A rendezvous that never completes waits for something absent: a node never started, ranks that never
checked in. The stacks show only the waiters; the launcher's own words say who was due (torchrun
``--nnodes 2 --nproc-per-node 2 --node-rank 0``: two nodes of two ranks, this is node 0, so node 1 with
ranks 2-3 is what never came, and where it was to meet us). The flags are data (engines/launchers.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hangwatch.engines.launchers import LAUNCHERS
from hangwatch.engines.launchers import WorldFlags


@dataclass(frozen=True)
class ExpectedWorld:
    launcher: str
    nodes: int
    node_rank: int | None
    per_node: int | None
    meet_at: str | None  # "127.0.0.1:29500"
    rank_word: str = "ranks"

    def missing(self, nodes_here: int = 1) -> str:
        """What never came, in words: "node rank 1 (ranks 2-3 of 4)"."""
        if self.nodes <= nodes_here:
            return ""
        others = [n for n in range(self.nodes) if n != self.node_rank] if self.node_rank is not None else []
        if not others:
            return f"{self.nodes - nodes_here} of {self.nodes} nodes"
        parts = []
        for n in others:
            if self.per_node:
                first, last = n * self.per_node, (n + 1) * self.per_node - 1
                one = self.rank_word[:-1]  # "rank", "DP rank"
                ranks = f"{one} {first}" if first == last else f"{self.rank_word} {first}-{last}"
                parts.append(f"node rank {n} ({ranks} of {self.nodes * self.per_node})")
            else:
                parts.append(f"node rank {n}")
        return ", ".join(parts)

    def describe(self) -> str:
        """The expectation and what is missing, for a verdict's explanation."""
        shape = f"{self.nodes} nodes" + (f" of {self.per_node} {self.rank_word}" if self.per_node else "")
        here = f"; this is node rank {self.node_rank}" if self.node_rank is not None else ""
        missing = self.missing()
        text = f"{self.launcher} expects {shape}{here}"
        if missing:
            text += f": {missing} never joined (not started, or cannot reach"
            text += f" {self.meet_at})" if self.meet_at else " the rendezvous)"
        return text


def expected_world(cmdlines: Sequence[Sequence[str]]) -> ExpectedWorld | None:
    """The first launcher command line of the tree that expects more than one node."""
    for argv in cmdlines:
        for flags in LAUNCHERS:
            if not any(word.endswith(mark) or word == mark for word in argv for mark in flags.recognise):
                continue
            world = _read(flags, argv)
            if world is not None:
                return world
    return None


def _read(flags: WorldFlags, argv: Sequence[str]) -> ExpectedWorld | None:
    nodes = _int(_value(argv, flags.nodes))
    if nodes is None:
        # torchrun's elastic form: --nnodes MIN:MAX waits for MIN
        raw = _value(argv, flags.nodes)
        nodes = _int(raw.split(":", 1)[0]) if raw else None
    per_node = _int(_value(argv, flags.per_node))
    node_rank = _int(_value(argv, flags.node_rank))
    ranks = _int(_value(argv, flags.ranks))
    if nodes is None and ranks is not None and per_node:
        # Counted in ranks (vLLM: --data-parallel-size 4 --data-parallel-size-local 2 is two nodes; the
        # first node's ranks start at 0, another's at --data-parallel-start-rank).
        nodes = -(-ranks // per_node)
        start = _int(_value(argv, flags.start_rank))
        node_rank = (start or 0) // per_node
    if nodes is None or nodes < 2:
        return None
    endpoint = _value(argv, flags.endpoint)
    host, port = _value(argv, flags.host), _value(argv, flags.port)
    meet_at = endpoint or (f"{host}:{port}" if host and port else host)
    return ExpectedWorld(flags.name, nodes, node_rank, per_node, meet_at, flags.rank_word)


def _value(argv: Sequence[str], names: Sequence[str]) -> str | None:
    for i, word in enumerate(argv):
        for name in names:
            if word == name and i + 1 < len(argv):
                return argv[i + 1]
            if word.startswith(name + "="):
                return word[len(name) + 1 :]
    return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
