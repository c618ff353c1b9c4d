"""Host lists as cluster users write them: ``node[1-16]``, ``gpu[01-04,09]``, ``a,b``, and host files.

The bracket syntax is pdsh's and ClusterShell's (and Slurm's ``scontrol show hostnames``): ranges keep
their zero padding. A host file has one host (or pattern) per line; ``#`` starts a comment, and
anything after the first word is ignored, so MPI host files (``node1 slots=8``) work as they are.
"""

from __future__ import annotations

import re
from pathlib import Path

from hangwatch.errors import UsageError

MAX_HOSTS = 100_000
_BRACKET = re.compile(r"\[([^\[\]]*)\]")
# Host names, addresses and ssh_config aliases; never a leading "-" (it would read as an ssh option).
_HOST = re.compile(r"^[A-Za-z0-9_.:%@][A-Za-z0-9_.:%@-]*$")


def expand(spec: str) -> list[str]:
    """``n[1-3],m`` -> ``[n1, n2, n3, m]``; order kept, duplicates dropped."""
    out: list[str] = []
    for item in _split_top(spec):
        out.extend(_expand_one(item))
        if len(out) > MAX_HOSTS:
            raise UsageError(f"more than {MAX_HOSTS} hosts in {spec!r}")
    for host in out:
        if not _HOST.match(host):
            raise UsageError(f"not a host name: {host!r} (in {spec!r})")
    return list(dict.fromkeys(out))


def read_hostfile(path: Path) -> list[str]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read the host file {path}: {exc.strerror}") from None
    hosts: list[str] = []
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if words:
            hosts.extend(expand(words[0]))
    return list(dict.fromkeys(hosts))


def _split_top(spec: str) -> list[str]:
    """Split on commas outside brackets."""
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in spec:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    items.append("".join(current))
    if depth != 0:
        raise UsageError(f"unbalanced brackets in {spec!r}")
    return [i.strip() for i in items if i.strip()]


def _expand_one(item: str) -> list[str]:
    m = _BRACKET.search(item)
    if m is None:
        return [item]
    head, tail = item[: m.start()], item[m.end() :]
    out = []
    for number in _range_items(m.group(1), item):
        out.extend(_expand_one(head + number + tail))
    return out


def _range_items(body: str, item: str) -> list[str]:
    numbers: list[str] = []
    for part in body.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise UsageError(f"not a range: [{body}] in {item!r}")
        if not sep:
            numbers.append(lo)
            continue
        width = len(lo) if lo.startswith("0") else 0
        first, last = int(lo), int(hi)
        if last < first or last - first > MAX_HOSTS:
            raise UsageError(f"bad range {part!r} in {item!r}")
        numbers.extend(str(n).zfill(width) for n in range(first, last + 1))
    return numbers
