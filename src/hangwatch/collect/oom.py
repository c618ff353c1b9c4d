"""Kernel and cgroup evidence that a SIGKILL came from the OOM killer.

Two sources, either may be unreadable: the kernel log (/dev/kmsg needs root or CAP_SYSLOG) and
the ``oom_kill`` counter of the cgroup v2 ``memory.events`` file. Nothing here raises.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def read_oom_kill_count(cgroup_path: str | None, cgroup_root: Path = CGROUP_ROOT) -> int | None:
    if cgroup_path is None:
        return None
    events = cgroup_root / cgroup_path.lstrip("/") / "memory.events"
    try:
        for line in events.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def kernel_oom_lines(pid: int, kmsg: Path = Path("/dev/kmsg")) -> list[str]:
    """Kernel log records that say the OOM killer killed ``pid`` (empty when unreadable)."""
    pattern = re.compile(
        rf"(?:Killed process {pid}\b|oom-kill:.*\bpid={pid}\b"
        rf"|Memory cgroup out of memory: Killed process {pid}\b)"
    )
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    found: list[str] = []
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: a record was overwritten while we read; keep going
                continue
            if not record:
                break
            text = record.decode("utf-8", "replace")
            message = text.split(";", 1)[1].strip() if ";" in text else text.strip()
            if pattern.search(message):
                found.append(message)
    finally:
        os.close(fd)
    return found


class OomWitness:
    """Remembers the cgroup OOM counter at start so a later SIGKILL can be checked against it."""

    def __init__(self, cgroup_paths: list[str | None], cgroup_root: Path = CGROUP_ROOT) -> None:
        self._root = cgroup_root
        self._baseline = {p: read_oom_kill_count(p, cgroup_root) for p in set(cgroup_paths) if p}

    def evidence_for(self, pid: int) -> str | None:
        lines = kernel_oom_lines(pid)
        if lines:
            return "kernel: " + lines[-1]
        for path, before in self._baseline.items():
            now = read_oom_kill_count(path, self._root)
            if before is not None and now is not None and now > before:
                return f"cgroup {path}: memory.events oom_kill rose from {before} to {now}"
        return None
