"""Applying a toggle's edits to a command line and an environment: pure functions, no processes.

A flag's value: ``--flag=v`` is one argument; ``--flag v`` is two when the next argument does not look
like an option itself (it does not start with ``-``, or it is a negative number). So removing
``--enforce-eager`` from ``... --enforce-eager --port 8000`` takes that one argument, and removing
``--spec`` from ``... --spec on`` takes two. A switch followed by a positional argument would take that
argument too: write the positional arguments before the options, as the engines' own examples do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from hangwatch.model.isolate import Edit
from hangwatch.model.isolate import EditKind
from hangwatch.model.isolate import Toggle

_NUMBER = re.compile(r"^-\d")


@dataclass(frozen=True)
class Applied:
    argv: tuple[str, ...]
    env_set: tuple[tuple[str, str], ...]  # variables the trial sets
    env_unset: tuple[str, ...]  # variables the trial removes

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        env = dict(base)
        for name in self.env_unset:
            env.pop(name, None)
        env.update(self.env_set)
        return env


def _is_value(arg: str) -> bool:
    return not arg.startswith("-") or bool(_NUMBER.match(arg))


def _matches(arg: str, names: tuple[str, ...]) -> str | None:
    """The spelling of ``names`` that ``arg`` is (``--flag`` or ``--flag=v``; ``--prefix-*`` for any
    flag of that prefix), or None."""
    for name in names:
        if name.endswith("*"):
            prefix = name[:-1]
            if arg.startswith(prefix) and len(arg) > len(prefix):
                return arg.split("=", 1)[0]
        elif arg == name or arg.startswith(name + "="):
            return name
    return None


def remove_flag(argv: tuple[str, ...], names: tuple[str, ...]) -> tuple[str, ...]:
    """``argv`` without every occurrence of the flag (any of ``names``) and its value."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if _matches(arg, names) is not None:
            if "=" not in arg and i + 1 < len(argv) and _is_value(argv[i + 1]):
                i += 1  # its value
            i += 1
            continue
        out.append(arg)
        i += 1
    return tuple(out)


def replace_flag(argv: tuple[str, ...], names: tuple[str, ...], value: str) -> tuple[str, ...]:
    """Every occurrence of the flag set to ``value`` (in the form it was given); added when absent."""
    out: list[str] = []
    found = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        spelling = _matches(arg, names)
        if spelling is None:
            out.append(arg)
            i += 1
            continue
        found = True
        if "=" in arg:
            out.append(f"{spelling}={value}")
        else:
            out += [spelling, value]
            if i + 1 < len(argv) and _is_value(argv[i + 1]):
                i += 1  # the old value
        i += 1
    if not found:
        out += [names[0], value]
    return tuple(out)


def apply_edits(argv: tuple[str, ...], edits: tuple[Edit, ...]) -> Applied:
    """The command line and environment changes of ``edits``, in order."""
    env_set: dict[str, str] = {}
    env_unset: list[str] = []
    for edit in edits:
        names = (edit.name, *edit.aliases)
        if edit.kind is EditKind.REMOVE:
            argv = remove_flag(argv, names)
        elif edit.kind is EditKind.REPLACE:
            argv = replace_flag(argv, names, edit.value or "")
        elif edit.kind is EditKind.ADD:
            if edit.name not in argv:
                argv = (*argv, edit.name)
        elif edit.kind is EditKind.ENV:
            env_set[edit.name] = edit.value or ""
            if edit.name in env_unset:
                env_unset.remove(edit.name)
        else:
            env_set.pop(edit.name, None)
            env_unset.append(edit.name)
    return Applied(argv, tuple(sorted(env_set.items())), tuple(env_unset))


def changes_anything(applied: Applied, argv: tuple[str, ...], env: Mapping[str, str]) -> bool:
    """Whether the trial differs from the baseline at all (a toggle for a flag not given changes nothing)."""
    if applied.argv != argv:
        return True
    if any(env.get(k) != v for k, v in applied.env_set):
        return True
    return any(k in env for k in applied.env_unset)


def combine(toggles: tuple[Toggle, ...]) -> Toggle:
    """Two (or more) toggles as one trial, for ``--pairs``."""
    return Toggle(
        name="+".join(t.name for t in toggles),
        edits=tuple(e for t in toggles for e in t.edits),
        why=" and ".join(t.why or t.name for t in toggles),
        suggested_by=tuple(dict.fromkeys(c for t in toggles for c in t.suggested_by)),
    )
