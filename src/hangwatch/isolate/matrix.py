"""``--matrix FILE``: the toggles to try, as TOML; every mistake is a ``UsageError`` that says what to fix.

```toml
[[toggle]]
name = "no-spec"
remove = ["--spec"]              # the flag and its value (`--spec on` or `--spec=on`)
why = "speculative decoding off" # optional: the change in words, for the conclusion
[[toggle]]
name = "graphs-off"
replace = { "--graphs" = "off" } # sets the flag's value, adding the flag if absent
causes = ["cuda-graph-capture"]  # optional: the baseline causes that make it worth trying first
[[toggle]]
name = "eager"
add = ["--enforce-eager"]
[[toggle]]
name = "p2p-off"
env = { NCCL_P2P_DISABLE = "1" }
unset_env = ["NCCL_DEBUG"]
```
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from hangwatch.errors import UsageError
from hangwatch.model.isolate import Edit
from hangwatch.model.isolate import EditKind
from hangwatch.model.isolate import Toggle
from hangwatch.model.vocabulary import Cause

EDIT_KEYS = ("remove", "replace", "add", "env", "unset_env")
KEYS = ("name", *EDIT_KEYS, "why", "causes")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
EXAMPLE = '[[toggle]]\nname = "no-spec"\nremove = ["--spec"]'


class MatrixError(UsageError):
    help_text = f"A matrix file is TOML, one [[toggle]] table per change, e.g.\n{EXAMPLE}\n(docs/isolate.md)"


def load_matrix(path: Path) -> tuple[Toggle, ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise MatrixError(f"--matrix {path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise MatrixError(f"--matrix {path}: not a text file (TOML is UTF-8 text)") from None
    return parse_matrix(text, str(path))


def parse_matrix(text: str, source: str = "the matrix") -> tuple[Toggle, ...]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MatrixError(f"--matrix {source}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"toggle"})
    if unknown:
        raise MatrixError(
            f"--matrix {source}: unknown top-level key(s) {', '.join(unknown)}: only [[toggle]] tables"
        )
    tables = data.get("toggle")
    if not isinstance(tables, list) or not tables:
        raise MatrixError(f"--matrix {source}: no [[toggle]] table: give at least one change to try")
    toggles: list[Toggle] = []
    seen: set[str] = set()
    for number, table in enumerate(tables, 1):
        toggle = _toggle(table, f"--matrix {source}: toggle {number}")
        if toggle.name in seen:
            raise MatrixError(f"--matrix {source}: two toggles are named {toggle.name!r}: give each its own")
        seen.add(toggle.name)
        toggles.append(toggle)
    return tuple(toggles)


def _toggle(table: dict[str, Any], where: str) -> Toggle:
    if isinstance(table.get("name"), str):
        where = f"{where} ({table['name']})"
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise MatrixError(f"{where}: unknown key(s) {', '.join(unknown)}; a toggle takes {', '.join(KEYS)}")
    name = table.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise MatrixError(
            f'{where}: needs a name = "..." (letters, digits, "-", "_", "."), e.g. name = "no-spec"'
        )
    where = f"{where} ({name})"
    edits: list[Edit] = []
    for flag in _strings(table, "remove", where):
        edits.append(Edit(EditKind.REMOVE, _flag(flag, where, "remove")))
    for flag, value in _table(table, "replace", where).items():
        edits.append(Edit(EditKind.REPLACE, _flag(flag, where, "replace"), value))
    for arg in _strings(table, "add", where):
        edits.append(Edit(EditKind.ADD, arg))
    for var, value in _table(table, "env", where).items():
        edits.append(Edit(EditKind.ENV, _var(var, where), value))
    for var in _strings(table, "unset_env", where):
        edits.append(Edit(EditKind.UNSET_ENV, _var(var, where)))
    if not edits:
        raise MatrixError(f"{where}: no edits: give at least one of {', '.join(EDIT_KEYS)}")
    why = table.get("why", "")
    if not isinstance(why, str):
        raise MatrixError(f'{where}: why must be a string, e.g. why = "speculative decoding off"')
    causes: list[Cause] = []
    for text in _strings(table, "causes", where):
        try:
            causes.append(Cause(text))
        except ValueError:
            raise MatrixError(
                f"{where}: causes: unknown cause {text!r}; one of {', '.join(c.value for c in Cause)}"
            ) from None
    return Toggle(name, tuple(edits), why, tuple(causes))


def _strings(table: dict[str, Any], key: str, where: str) -> list[str]:
    value = table.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise MatrixError(f'{where}: {key} must be a list of strings, e.g. {key} = ["--flag"]')
    return value


def _table(table: dict[str, Any], key: str, where: str) -> dict[str, str]:
    value = table.get(key, {})
    if not isinstance(value, dict):
        raise MatrixError(f'{where}: {key} must be a table, e.g. {key} = {{ "--flag" = "value" }}')
    out: dict[str, str] = {}
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise MatrixError(f'{where}: {key}: the value of {k!r} must be a string, e.g. "1"')
        out[k] = v if isinstance(v, str) else str(v)
    return out


def _flag(flag: str, where: str, key: str) -> str:
    if not flag.startswith("-") or flag in ("-", "--"):
        raise MatrixError(f"{where}: {key}: {flag!r} is not a flag: give it with its dashes, e.g. --{flag}")
    return flag


def _var(name: str, where: str) -> str:
    if not _ENV_NAME.match(name):
        raise MatrixError(f"{where}: {name!r} is not an environment variable name")
    return name
