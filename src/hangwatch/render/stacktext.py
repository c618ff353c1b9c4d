"""The merged stack tree as compact text lines (terminal verdict, Markdown, ``hangwatch stacks``).

Chains of frames that every member of a node passes through are folded into one line showing the
first frame and the innermost ones; branches are drawn with ASCII so any terminal shows them. The
odd ones out are marked, and a leaf says whether its threads moved between samples.
"""

from __future__ import annotations

from hangwatch.model.stacks import StackNode
from hangwatch.model.stacks import StackTree
from hangwatch.words import plural

ODD = "<< odd one out"


def tree_lines(tree: StackTree, max_lines: int = 24, width: int = 160) -> list[str]:
    """``[rank0-1] ... all_reduce (distributed_c10d.py:3252) > c10d::Work::wait`` lines, deepest last."""
    head = f"stacks: {tree.summary}"
    lines = [_clip(head, width)]
    counts = [
        plural(tree.samples, "sample"),
        plural(tree.processes, "process"),
        plural(tree.threads, "thread"),
    ]
    lines.append(f"  ({counts[0]}; {counts[1]}, {counts[2]})")
    body: list[str] = []
    for root in tree.roots:
        _walk(root, "  ", "", body, width=width, samples=tree.samples)
    if len(body) > max_lines:
        body = [
            *body[: max_lines - 1],
            f"  ... {len(body) - max_lines + 1} more lines in the JSON/HTML report",
        ]
    lines.extend(body)
    lines.extend(f"  not dumped: {p}" for p in tree.problems[:6])
    return lines


def fold(node: StackNode) -> list[StackNode]:
    """The chain of nodes below ``node`` that all its members pass through (one child, same pids)."""
    chain = [node]
    while len(chain[-1].children) == 1 and chain[-1].children[0].pids == node.pids and chain[-1].ends == 0:
        chain.append(chain[-1].children[0])
    return chain


def chain_text(chain: list[StackNode], keep: int = 3, short: bool = True) -> str:
    """First frame, then the innermost Python frame and the native calls right below it (the wait)."""
    last_py = max((i for i, n in enumerate(chain) if not n.native), default=len(chain) - 1)
    tail = list(range(max(last_py - keep + 3, 1), min(last_py + 3, len(chain))))
    picked = list(range(len(chain))) if len(chain) <= keep + 2 or not tail else [0, *tail]
    parts: list[str] = []
    for prev, i in zip([-1, *picked], picked, strict=False):
        if i - prev > 1:
            parts.append("...")
        parts.append(chain[i].describe(short))
    return " > ".join(parts)


def _walk(node: StackNode, indent: str, branch: str, out: list[str], *, width: int, samples: int) -> None:
    chain = fold(node)
    last = chain[-1]
    mark = f" {ODD}" if last.minority else ""
    moved = ""
    if last.ends and samples >= 2:
        moved = " [unchanged]" if last.unchanged == last.ends else f" [moved: {last.ends - last.unchanged}]"
    suffix = f"{moved}{mark}"
    out.append(_clip(f"{indent}{branch}[{last.label}] {chain_text(chain)}", width - len(suffix)) + suffix)
    children = list(last.children)
    child_indent = indent + ("   " if branch.startswith("`") else "|  " if branch else "")
    for i, child in enumerate(children):
        _walk(
            child, child_indent, "`- " if i == len(children) - 1 else "+- ", out, width=width, samples=samples
        )


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
