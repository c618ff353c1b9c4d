"""Labels compacted into ranges, as the reports print them: ``TP0-6,TP7``, across nodes
``node[0-104]:rank0-1041`` (a run of global ranks over a host list), and host lists as Slurm writes them
(``node[001-003,007]``). Text only: the analysis names the processes (``analyse.stackranks``), this says
many names in few words, for the analysis's sentences and the renderers alike."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from collections.abc import Sequence

_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def split_label(label: str) -> tuple[str, int | None]:
    """``TP3`` -> ("TP", 3); a label without a trailing number, or a ``role[pid]``, is itself, no number."""
    if label.isascii() and "\n" not in label:
        # _NUMBERED's answer without the regex (a third of the cost of labelling 10,000 ranks): on one
        # line of ASCII its digits are the trailing run of 0-9.
        stem = label.rstrip("0123456789")
        if stem == label or "[" in label:
            return label, None
        return stem, int(label[len(stem) :])
    m = _NUMBERED.match(label)
    if m and "[" not in label:
        return m.group(1), int(m.group(2))
    return label, None


def compact_ranges(labels: Iterable[str]) -> str:
    """``[TP0, TP1, TP2, TP4, rank1, main[7]]`` -> ``TP0-2,TP4,rank1,main[7]``."""
    numbered: dict[str, list[int]] = {}
    other: list[str] = []
    for label in dict.fromkeys(labels):
        prefix, number = split_label(label)
        if number is not None:
            numbered.setdefault(prefix, []).append(number)
        else:
            other.append(label)
    return ranges_text(numbered, other)


def ranges_text(numbered: dict[str, list[int]], other: list[str]) -> str:
    """``compact_ranges``' text from its labels split: the numbers under each prefix, and the rest.

    A prefix that names a node (``hwn2:rank``, as the merge across nodes labels ranks) is read as the node
    and the stem (``rank``), and a stem's numbers are folded across nodes (``node_runs``)."""
    by_stem: dict[str, list[tuple[int, str]]] = {}
    for prefix, numbers in numbered.items():
        node, stem = split_node(prefix)
        by_stem.setdefault(stem, []).extend((n, node) for n in numbers)
    return stems_text(by_stem, other)


def stems_text(by_stem: dict[str, list[tuple[int, str]]], other: list[str]) -> str:
    """``ranges_text`` from each stem's (number, node) members, in any order, and the labels without one."""
    parts = [part for stem in sorted(by_stem) for part in node_runs(stem, sorted(by_stem[stem]))]
    return ",".join(parts + sorted(other))


def split_node(prefix: str) -> tuple[str, str]:
    """``hwn2:rank`` -> ("hwn2", "rank"); a prefix without a node is ("", itself)."""
    node, colon, stem = prefix.rpartition(":")
    return (node, stem) if colon and node else ("", prefix)


def node_runs(stem: str, members: Sequence[tuple[int, str]], hosts: HostLists | None = None) -> list[str]:
    """The runs of a stem's numbers, ``members`` (number, node) in that order; ``hosts``: the members'
    nodes read as host lists, where the caller has them already.

    Across nodes the numbers are global (a job's ranks, a TP group's ranks): a run of consecutive numbers
    goes on across nodes of one host list (``node[0-104]:rank0-1041``), so that 10,000 ranks on 1,000
    nodes read as a few runs, not one per node. Where a number is on several nodes (the nodes number
    their own processes, or two jobs), the runs are per node (``n1:TP0-7,n2:TP0-7``)."""
    if not members:
        return []
    if hosts is None:
        hosts = HostLists(node for _, node in members)
    out: list[str] = []
    start, last = members[0]
    prev = start
    nodes = [last]
    for n, node in itertools.islice(members, 1, None):
        if n == prev + 1 and (node == last or hosts.same_list(node, last)):
            prev = n
            if node != last:
                nodes.append(node)
                last = node
            continue
        if n == prev:
            if node == last:
                continue  # the same label twice: named once
            return _per_node(stem, members)
        out.append(_node_run(stem, start, prev, hosts, nodes))
        start = prev = n
        nodes = [node]
        last = node
    out.append(_node_run(stem, start, prev, hosts, nodes))
    return out


def _per_node(stem: str, members: Sequence[tuple[int, str]]) -> list[str]:
    by_node: dict[str, set[int]] = {}
    for n, node in members:
        by_node.setdefault(node, set()).add(n)
    return [
        part
        for node in sorted(by_node)
        for part in _runs(f"{node}:{stem}" if node else stem, sorted(by_node[node]))
    ]


def _node_run(stem: str, start: int, end: int, hosts: HostLists, nodes: list[str]) -> str:
    where = f"{hosts.text(nodes)}:" if nodes != [""] else ""
    return f"{where}{stem}{start}" if start == end else f"{where}{stem}{start}-{end}"


def host_list(names: Iterable[str]) -> str:
    """Node names as Slurm writes a host list (``node[0-999],login``): each list of one stem and width
    compacted, the lists in the order their first names come."""
    hosts = HostLists(names)
    groups: dict[tuple[str, int] | str, list[str]] = {}
    for name, split in hosts.splits.items():
        groups.setdefault(split[:2] if split is not None else name, []).append(name)
    return ",".join(hosts.text(members) for members in groups.values())


class HostLists:
    """Node names read as Slurm writes host lists: ``node[001-003,007]``, a stem and numbers of one width
    (zero-padded names keep their width; a name without a trailing number is a list of its own)."""

    def __init__(self, nodes: Iterable[str]) -> None:
        self.splits: dict[str, tuple[str, int, int] | None] = {}  # name -> (stem, width, number)
        padded: set[str] = set()
        for node in dict.fromkeys(nodes):
            stem = node.rstrip("0123456789") if node.isascii() else node
            digits = node[len(stem) :]
            if not digits:
                self.splits[node] = None
                continue
            self.splits[node] = (stem, len(digits), int(digits))
            if len(digits) > 1 and digits[0] == "0":
                padded.add(stem)
        # Unpadded names fold whatever their length (node9, node10); padded ones by their width.
        for node, split in self.splits.items():
            if split is not None and split[0] not in padded:
                self.splits[node] = (split[0], 0, split[2])

    def same_list(self, a: str, b: str) -> bool:
        if a == b:
            return True
        sa, sb = self.splits.get(a), self.splits.get(b)
        return sa is not None and sb is not None and sa[:2] == sb[:2]

    def text(self, nodes: Sequence[str]) -> str:
        """One host list's nodes (distinct, of one list) as Slurm writes them."""
        if len(nodes) == 1:
            return nodes[0]
        first = self.splits[nodes[0]]
        assert first is not None
        stem, width = first[0], first[1]
        numbers = sorted({split[2] for node in nodes if (split := self.splits[node]) is not None})
        runs = ",".join(_runs("", numbers, width))
        return f"{stem}[{runs}]"


def ranks_label(ranks: Iterable[str]) -> str:
    """Ranks as the profiles give them (``3``, ``TP3``) compacted: from the numbers where every one is a
    number (a node's ranks, every node's), else as labels (``rank3``, ``TP3``)."""
    ranks = list(ranks)
    if all(r.isascii() and r.isdigit() for r in ranks):
        return rank_ranges(int(r) for r in ranks)
    return compact_ranges(f"rank{r}" if r.isdigit() else r for r in ranks)


def rank_ranges(ranks: Iterable[int]) -> str:
    """``compact_ranges`` of ``rank<n>`` labels (n >= 0), from the numbers: no label built and split again."""
    numbers = sorted(set(ranks))
    return ",".join(_runs("rank", numbers)) if numbers else ""


def rank_words(ranks: Iterable[int]) -> str:
    """Global ranks in words: ``rank 3``, ``ranks 0-2,5``."""
    numbers = tuple(dict.fromkeys(ranks))
    text = compact_ranges(f"rank{r}" for r in numbers)
    return text.replace("rank", "ranks ", 1) if len(numbers) > 1 else text.replace("rank", "rank ", 1)


def _runs(prefix: str, numbers: list[int], width: int = 0) -> list[str]:
    out: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        first = f"{prefix}{start:0{width}}"
        out.append(first if start == prev else f"{first}-{prev:0{width}}")
        if n is not None:
            start = prev = n
    return out
