"""``run.json`` in a run directory: the tree a ``hangwatch run`` launched, for ``hangwatch cleanup --run``.

Written once at launch. The pid alone is not enough to find the tree again later (pids are
reused): the record also holds the root's start time (clock ticks since boot, field 22 of
/proc/PID/stat) and its session id; a session id is never handed out again while any process
still belongs to that session, so the session finds the orphans of a dead root safely.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import asdict
from dataclasses import dataclass
from pathlib import Path

from hangwatch.collect import procfs
from hangwatch.redact import scrub
from hangwatch.render.files import write_atomically

RUN_SCHEMA = "hangwatch.run/1"
RUN_RECORD = "run.json"


@dataclass(frozen=True)
class RunRecord:
    schema: str
    pid: int  # the launched command's pid (its session and process group leader)
    start_ticks: int  # its start time: with pid, its identity
    session: int
    supervisor_pid: int  # the hangwatch run process itself
    command: tuple[str, ...]  # redacted
    started_at: str  # wall clock, ISO 8601


def write_run_record(run_dir: Path, pid: int, command: tuple[str, ...]) -> RunRecord | None:
    """Record the launched tree; None (and no file) if the process is already gone."""
    stat = procfs.read_stat(pid)
    if stat is None:
        return None
    record = RunRecord(
        schema=RUN_SCHEMA,
        pid=pid,
        start_ticks=stat.starttime_ticks,
        session=stat.session,
        supervisor_pid=os.getpid(),
        command=tuple(scrub(a) for a in command),
        started_at=dt.datetime.now().astimezone().isoformat(timespec="seconds"),
    )
    write_atomically(run_dir / RUN_RECORD, json.dumps(asdict(record), indent=1) + "\n")
    return record


def read_run_record(run_dir: Path) -> RunRecord:
    """The record of a run directory; ValueError saying why when there is none or it is unreadable."""
    path = run_dir / RUN_RECORD
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(
            f"{path} does not exist (the run was made by an older hangwatch, or this is not a run directory)"
        ) from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is unreadable: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != RUN_SCHEMA:
        raise ValueError(f"{path} is not a hangwatch run record ({RUN_SCHEMA})")
    try:
        return RunRecord(
            schema=RUN_SCHEMA,
            pid=int(data["pid"]),
            start_ticks=int(data["start_ticks"]),
            session=int(data["session"]),
            supervisor_pid=int(data["supervisor_pid"]),
            command=tuple(str(a) for a in data["command"]),
            started_at=str(data["started_at"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path} lacks a field: {exc}") from None
