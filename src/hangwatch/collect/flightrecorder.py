"""torch's Flight Recorder: the environment that turns it on for a launched tree, the dump pipes that make
a live rank write it, and the dumps read back (issue 26; docs/flight-recorder.md).

Measured on an H100, torch 2.11 (scripts/gpu/probe_flight_recorder.py, 2026-12-06): with
``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=STEM`` each NCCL rank makes the FIFO ``STEM<rank>.pipe``; a byte written
to it makes the rank dump its recorder to ``TORCH_FR_DUMP_TEMP_FILE<rank>`` (else
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>``) 5.1 s later, a pickle of plain dicts and lists, and the rank runs
on. Gloo records its collectives too (torch 2.13's CPU build) but has no pipe: only a dump already written
(NCCL's dump on timeout, a program's own) is read there.

A dump is the rank's own bytes: loaded with no class allowed (plain containers only), capped in size.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import stat
import time
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hangwatch.collect import procfs
from hangwatch.model.flightrecorder import FlightCapture
from hangwatch.model.flightrecorder import GroupStatus
from hangwatch.model.flightrecorder import RankDump
from hangwatch.model.samples import ProcessSample

PIPE_VARS = ("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "TORCH_FR_DEBUG_INFO_PIPE_FILE")
DUMP_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
ENV_KEYS = frozenset({*PIPE_VARS, *DUMP_VARS, *BUFFER_VARS, "RANK"})
# Entries a launched tree's recorder keeps: torch's own suggestion for debugging hangs; each is a few
# hundred bytes, and the recorder costs microseconds a collective.
BUFFER_ENTRIES = 2000
# NCCL's monitor polls its pipe every few seconds: 5.1 s from the write to the dump, measured.
DUMP_WAIT_S = 8.0
MAX_DUMP_BYTES = 64 << 20
# Where torch writes a dump when neither dump variable is set (its own default, not a file we create).
TORCH_DEFAULT_DUMP = "/tmp/nccl_trace_rank_"  # noqa: S108


def launch_environment(folder: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a launch adds so that a stall can read the recorder: none the user set already."""
    if any(environ.get(name) for name in (*PIPE_VARS, *DUMP_VARS, *BUFFER_VARS)):
        return {}  # the user runs the recorder their way: read what they set, change nothing
    return {
        "TORCH_FR_BUFFER_SIZE": str(BUFFER_ENTRIES),
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(folder / "pipe_rank_"),
        "TORCH_FR_DUMP_TEMP_FILE": str(folder / "fr_rank_"),
    }


@dataclass(frozen=True)
class Target:
    rank: int
    pid: int | None  # its process, where the tree's RANK says which
    pipe: Path | None  # the rank's FIFO, where it made one (NCCL)
    dump: Path  # where its dump goes


def targets(processes: Iterable[ProcessSample]) -> list[Target]:
    """The ranks of the tree with the recorder on: every FIFO its NCCL groups made (``<stem><rank>.pipe``,
    found by name, so that engines whose workers carry no ``RANK``, vLLM's and SGLang's, are found too),
    and the ranks whose ``RANK`` says which dump is theirs where there is no pipe (gloo). A rank's process
    is the oldest with its ``RANK`` (its compile workers inherit it), where one says so."""
    pid_of: dict[int, int] = {}
    ways: set[tuple[str | None, str]] = set()  # (pipe stem, dump prefix) as the tree's processes set them
    for p in sorted(processes, key=lambda p: p.pid):
        env = procfs.read_environ(p.pid, ENV_KEYS)
        if not any(env.get(name, "0") not in ("", "0") for name in BUFFER_VARS):
            continue
        stem = next((env[n] for n in PIPE_VARS if env.get(n)), None)
        ways.add((stem, next((env[n] for n in DUMP_VARS if env.get(n)), TORCH_DEFAULT_DUMP)))
        rank_text = env.get("RANK", "")
        if rank_text.isdigit():
            pid_of.setdefault(int(rank_text), p.pid)
    found: dict[int, Target] = {}
    for stem, prefix in sorted(ways, key=lambda w: (w[0] or "", w[1])):
        for rank, pipe in _pipes(stem):
            found.setdefault(rank, Target(rank, pid_of.get(rank), pipe, Path(f"{prefix}{rank}")))
        for rank, pid in pid_of.items():
            found.setdefault(rank, Target(rank, pid, None, Path(f"{prefix}{rank}")))
    return [found[r] for r in sorted(found)]


def _pipes(stem: str | None) -> list[tuple[int, Path]]:
    """The FIFOs ``<stem><rank>.pipe`` that exist: each is a live NCCL group's, made by its rank."""
    if not stem:
        return []
    folder, name = Path(stem).parent, Path(stem).name
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    out = []
    for path in entries:
        rank = path.name[len(name) : -len(".pipe")]
        if path.name.startswith(name) and path.name.endswith(".pipe") and rank.isdigit() and _is_fifo(path):
            out.append((int(rank), path))
    return sorted(out)


def capture(found: list[Target], not_before: float, wait_s: float = DUMP_WAIT_S) -> FlightCapture:
    """Make every rank with a pipe dump, wait for the dumps (at most ``wait_s``), read them all.

    ``not_before``: a dump older than this (Unix time: the tree's start) is an earlier run's, not read."""
    start = time.monotonic()
    asked = time.time()
    written = sum(1 for t in found if t.pipe is not None and _poke(t.pipe))
    pending = {t.rank for t in found if t.pipe is not None}
    deadline = start + wait_s
    while pending and time.monotonic() < deadline:
        pending = {r for r in pending if not _fresh(next(t for t in found if t.rank == r).dump, asked)}
        if pending:
            time.sleep(0.1)
    dumps, missing = [], []
    for t in found:
        if not _fresh(t.dump, not_before):
            why = "no dump within the wait" if t.pipe is not None else "no dump pipe (not NCCL) and no dump"
            missing.append((t.rank, why))
            continue
        try:
            dumps.append(parse(load(t.dump), t.rank, t.pid))
        except Exception as exc:  # another process's bytes: whatever they hold, one rank's note, no crash
            missing.append((t.rank, f"dump unreadable: {type(exc).__name__}: {str(exc)[:200]}"))
    return FlightCapture(tuple(dumps), tuple(missing), written, round(time.monotonic() - start, 3))


class _PlainOnly(pickle.Unpickler):
    """A dump is another process's bytes: no class of any module is ever built from it."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a dump may hold plain data only, not {module}.{name}")


def load(path: Path) -> Any:
    with path.open("rb") as f:
        raw = f.read(MAX_DUMP_BYTES + 1)
    if len(raw) > MAX_DUMP_BYTES:
        raise ValueError(f"over {MAX_DUMP_BYTES >> 20} MiB")
    return _PlainOnly(io.BytesIO(raw)).load()


def parse(data: Any, rank: int, pid: int | None) -> RankDump:
    """A dump's groups: their status, members and each collective's name by sequence number."""
    if not isinstance(data, dict):
        raise ValueError(f"not a Flight Recorder dump (a {type(data).__name__})")
    config = data.get("pg_config")
    status = data.get("pg_status")
    config = config if isinstance(config, dict) else {}
    status = status if isinstance(status, dict) else {}
    ops: dict[str, dict[int, str]] = {}  # pg_status's key (the group's id) -> seq -> its collective
    entries = data.get("entries")
    for e in entries if isinstance(entries, list) else ():
        if isinstance(e, dict) and isinstance(e.get("collective_seq_id"), int):
            ops.setdefault(str(e.get("pg_id", "")), {})[e["collective_seq_id"]] = str(
                e.get("profiling_name", "?")
            )
    groups = []
    for pg, s in status.items() if isinstance(status, dict) else ():
        if not isinstance(s, dict):
            continue
        # Keyed by the group's name, which is its id for NCCL ("0") and empty for gloo's default group.
        conf = config.get(pg) or (next(iter(config.values())) if len(config) == 1 else {}) or {}
        groups.append(
            GroupStatus(
                pg=str(pg),
                desc=str(conf.get("desc") or ""),
                ranks=_ranks(conf.get("ranks")),
                last_enqueued=_int(s.get("last_enqueued_collective")),
                last_started=_int(s.get("last_started_collective")),
                last_completed=_int(s.get("last_completed_collective")),
                ops=tuple(sorted(ops.get(str(pg), {}).items())),
            )
        )
    return RankDump(rank, pid, tuple(groups), str(data.get("version", "")))


def _ranks(text: Any) -> tuple[int, ...]:
    """pg_config's ranks: "[0, 1]" (a string in the dump)."""
    parts = str(text or "").strip("[] ").split(",")
    return tuple(int(p) for p in (x.strip() for x in parts) if p.lstrip("-").isdigit())


def _int(value: Any) -> int:
    return value if isinstance(value, int) else -1


def _is_fifo(path: Path) -> bool:
    with contextlib.suppress(OSError):
        return stat.S_ISFIFO(path.stat().st_mode)
    return False


def _poke(pipe: Path) -> bool:
    """One byte into the rank's pipe, never blocking: ENXIO means nobody reads it (the rank is gone)."""
    try:
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False  # ENXIO: no reader (the rank is gone or never opened it); ENOENT, EACCES: not ours
    try:
        os.write(fd, b"1\n")
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _fresh(path: Path, since: float) -> bool:
    with contextlib.suppress(OSError):
        s = path.stat()
        return s.st_size > 0 and s.st_mtime >= since
    return False
