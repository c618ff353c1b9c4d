"""Next steps fitted to the case: a cause's usual advice (``causes.NEXT_STEPS``) with what this watch knows.

The table says ``PID``, ``PORT`` and ``HOST:PORT`` where any case would; a verdict knows the culprit's pid
and the port the server was probed on, so those are written in. Advice that reads a live process
(``/proc/PID/...``, ``py-spy dump --pid``, ``kill -CONT``, ``hangwatch stacks --pid``) is moot once ``run``
has stopped the tree: it is left out, and one step says how to keep the tree for a look next time.
NCCL's variables are advice only where NCCL is in use (a process of the tree mapped ``libnccl``, or a
stack named it): a gloo job on CPUs has none. The rest stays as written.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# A clause of a step: sentences and the parts of one joined by "; " are advice of their own.
_CLAUSES = re.compile(r"(?<=[.;])\s+")
# What reads a process that must be alive (our own wording in NEXT_STEPS and the rules' steps).
_LIVE = re.compile(r"/proc/PID\b|--pid PID\b|kill -CONT PID\b|py-spy dump\b")
_NCCL = re.compile(r"\bNCCL_[A-Z_]+|\bTORCH_NCCL_[A-Z_]+")
_PID = re.compile(r"\bPID\b")
_HOST_PORT = re.compile(r"\bHOST:PORT\b")
_PORT = re.compile(r"\bPORT\b")

KEEP_FOR_A_LOOK = (
    "To look at the live processes yourself (py-spy, /proc, a debugger), run it again with "
    "`hangwatch run --keep-running ...`: a stall is reported and the tree left running until Ctrl-C."
)


@dataclass(frozen=True)
class StepFacts:
    """What a watch knows that the generic advice leaves as a placeholder."""

    pid: int | None  # what PID stands for: the first culprit, else the tree's root
    port: int | None  # the port the server was probed on (or listens on)
    host: str = "127.0.0.1"
    tree_alive: bool = True  # False once run has stopped the tree
    nccl: bool | None = None  # None: not known, the NCCL advice stays
    kept_running: bool = False  # run --keep-running: the tree was there to look at; no advice to keep it


def fit(steps: Sequence[str], facts: StepFacts) -> tuple[str, ...]:
    """``steps`` with the known values in, and without the advice that cannot apply here."""
    out: list[str] = []
    dropped_live = False
    for step in steps:
        kept = []
        for clause in _CLAUSES.split(step):
            if facts.nccl is False and _NCCL.search(clause):
                continue
            if not facts.tree_alive and _LIVE.search(clause):
                dropped_live = True
                continue
            kept.append(_filled(clause, facts))
        if not kept:
            continue
        text = " ".join(kept)
        text = text[:-1] + "." if text.endswith(";") else text
        text = text[:1].upper() + text[1:]  # a step whose first clause went starts a sentence
        if text not in out:
            out.append(text)
    if dropped_live and not facts.kept_running:
        out.append(KEEP_FOR_A_LOOK)
    return tuple(out)


def _filled(clause: str, facts: StepFacts) -> str:
    if facts.port is not None:
        clause = _HOST_PORT.sub(f"{facts.host}:{facts.port}", clause)
        clause = _PORT.sub(str(facts.port), clause)
    if facts.pid is not None:
        clause = _PID.sub(str(facts.pid), clause)
    return clause
