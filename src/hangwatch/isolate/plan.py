"""Which trials, in which order: the toggles the baseline's cause points at first, then the rest.

The built-in toggles say which causes they answer (``Toggle.suggested_by``); a matrix toggle may say so
with ``causes = [...]``, and otherwise its flags do (``graph``/``eager`` -> CUDA graph capture, ``nccl``,
``p2p``, ``all-reduce``, ``tp`` -> ranks waiting on each other, ``compile`` -> compile stalls). Pairs
(``--pairs``) come after every single change, and only of toggles that did not make it boot alone: a pair
that holds one that boots alone is not a minimal change.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass

from hangwatch.engines.profile import RANKS_WAIT
from hangwatch.isolate.toggles import Applied
from hangwatch.isolate.toggles import apply_edits
from hangwatch.isolate.toggles import changes_anything
from hangwatch.isolate.toggles import combine
from hangwatch.model.isolate import Toggle
from hangwatch.model.vocabulary import Cause

_HINTS: tuple[tuple[re.Pattern[str], tuple[Cause, ...]], ...] = (
    (re.compile(r"graph|eager", re.I), (Cause.CUDA_GRAPH_CAPTURE, Cause.GPU_SPIN)),
    (re.compile(r"compile|eager|-O\d", re.I), (Cause.COMPILE_STALL,)),
    (re.compile(r"spec|draft|eagle|mtp", re.I), (Cause.CUDA_GRAPH_CAPTURE, *RANKS_WAIT)),
    (re.compile(r"nccl|p2p|all-?reduce|tensor-parallel|--tp\b|-tp\b|gloo|shm", re.I), RANKS_WAIT),
    (re.compile(r"mem|cache|kv", re.I), (Cause.CUDA_OOM, Cause.OOM_KILLED)),
    (re.compile(r"port|host", re.I), (Cause.PORT_IN_USE,)),
)


def suggested_causes(toggle: Toggle) -> tuple[Cause, ...]:
    """The causes a toggle answers: its own list, else what its flags and variables suggest."""
    if toggle.suggested_by:
        return toggle.suggested_by
    words = " ".join([toggle.name, *(f"{e.name} {e.value or ''}" for e in toggle.edits)])
    found: dict[Cause, None] = {}
    for pattern, causes in _HINTS:
        if pattern.search(words):
            found.update(dict.fromkeys(causes))
    return tuple(found)


def order(toggles: tuple[Toggle, ...], cause: Cause | None) -> tuple[Toggle, ...]:
    """The toggles the baseline's cause suggests first (in their given order), then the others."""
    if cause is None:
        return toggles
    first = tuple(t for t in toggles if cause in suggested_causes(t))
    return first + tuple(t for t in toggles if t not in first)


@dataclass(frozen=True)
class Candidate:
    toggle: Toggle
    applied: Applied


def applicable(
    toggles: tuple[Toggle, ...], argv: tuple[str, ...], env: Mapping[str, str]
) -> tuple[tuple[Candidate, ...], tuple[str, ...]]:
    """The toggles that change this command (or its environment), and a note for each that does not."""
    out: list[Candidate] = []
    notes: list[str] = []
    for toggle in toggles:
        applied = apply_edits(argv, toggle.edits)
        if changes_anything(applied, argv, env):
            out.append(Candidate(toggle, applied))
        else:
            notes.append(
                f"toggle {toggle.name} ({toggle.describe()}): changes nothing in this command, not run"
            )
    return tuple(out), tuple(notes)


def pairs(
    singles: tuple[Toggle, ...], booted_alone: set[str], argv: tuple[str, ...], env: Mapping[str, str]
) -> tuple[Candidate, ...]:
    """Every pair of toggles neither of which made it boot alone, in the singles' order."""
    rest = tuple(t for t in singles if t.name not in booted_alone)
    combined = tuple(combine(p) for p in itertools.combinations(rest, 2))
    found, _ = applicable(combined, argv, env)
    return found
