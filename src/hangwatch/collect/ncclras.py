"""NCCL's RAS service, asked as its own client (``ncclras``) does: a line protocol on a TCP socket
(``localhost:28028``, or the job's ``NCCL_RAS_ADDR``): ``CLIENT PROTOCOL 2`` -> ``SERVER PROTOCOL 2``,
``SET FORMAT json`` -> ``OK``, ``VERBOSE STATUS`` -> the job's state, until the service closes the
connection. Checked against NCCL 2.28.9 on an H100 (scripts/gpu/probe_nccl_ras.py, 2026-12-06); a service
without the JSON format (before 2.28) is said to be too old, not guessed at from its text tables.

Read-only: the service answers from its own state; no rank is paused or signalled.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from typing import Any

from hangwatch.collect import procfs
from hangwatch.model.ncclras import RasCommunicator
from hangwatch.model.ncclras import RasRank
from hangwatch.model.ncclras import RasSnapshot
from hangwatch.model.samples import ProcessSample

DEFAULT_PORT = 28028
ENV_KEYS = frozenset({"NCCL_RAS_ADDR", "NCCL_RAS_ENABLE"})
PROTOCOL = 2
MAX_ANSWER_BYTES = 8 << 20  # a thousand ranks' state is well under this


class RasUnavailable(Exception):
    """The service could not be asked, or answered nothing usable: why, in words."""


def service_address(processes: Sequence[ProcessSample]) -> tuple[str, int] | None:
    """Where this node's RAS service answers, when a member of the tree listens there: the ranks'
    ``NCCL_RAS_ADDR`` (host:port), else localhost:28028. None where no member listens on it (no NCCL, or
    RAS off with ``NCCL_RAS_ENABLE=0``)."""
    listening = {port for p in processes for port in p.listening_ports}
    for p in processes:
        env = procfs.read_environ(p.pid, ENV_KEYS)
        if env.get("NCCL_RAS_ENABLE") == "0":
            return None
        host, _, port = env.get("NCCL_RAS_ADDR", "").rpartition(":")
        if port.isdigit() and int(port) in listening:
            return host.strip("[]") or "127.0.0.1", int(port)
    return ("127.0.0.1", DEFAULT_PORT) if DEFAULT_PORT in listening else None


def query(host: str, port: int, t: float, timeout_s: float = 10.0) -> RasSnapshot:
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            hello = _exchange(s, f"CLIENT PROTOCOL {PROTOCOL}")
            if not hello.upper().startswith("SERVER PROTOCOL"):
                raise RasUnavailable(f"not an NCCL RAS service (it said {hello[:80]!r})")
            if _exchange(s, "SET FORMAT json").upper() != "OK":
                raise RasUnavailable("the RAS service has no JSON format (NCCL before 2.28)")
            s.sendall(b"VERBOSE STATUS\n")
            answer = _read_all(s)
    except OSError as exc:
        raise RasUnavailable(f"{host}:{port}: {exc.strerror or exc}") from None
    try:
        data = json.loads(answer)
    except ValueError as exc:
        raise RasUnavailable(f"its answer is not JSON: {exc}") from None
    return parse(data, t)


def _exchange(s: socket.socket, line: str) -> str:
    s.sendall(f"{line}\n".encode())
    got = b""
    while not got.endswith(b"\n") and len(got) < 4096:
        chunk = s.recv(1)
        if not chunk:
            break
        got += chunk
    return got.decode("utf-8", "replace").strip()


def _read_all(s: socket.socket) -> str:
    chunks: list[bytes] = []
    size = 0
    while size <= MAX_ANSWER_BYTES:
        data = s.recv(65536)
        if not data:
            break
        chunks.append(data)
        size += len(data)
    if size > MAX_ANSWER_BYTES:
        raise RasUnavailable(f"its answer is over {MAX_ANSWER_BYTES >> 20} MiB")
    return b"".join(chunks).decode("utf-8", "replace")


def parse(data: Any, t: float) -> RasSnapshot:
    """The service's JSON as a snapshot; RasUnavailable for a shape it is not (never another error)."""
    try:
        return _parse(data, t)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise RasUnavailable(f"its answer is not the JSON expected: {type(exc).__name__}: {exc}") from None


def _parse(data: Any, t: float) -> RasSnapshot:
    comms = []
    for c in data.get("communicators") or ():
        ranks = tuple(_rank(r) for r in c.get("ranks") or ())
        missing = tuple(
            int(m["rank"]) if isinstance(m, dict) else int(m) for m in c.get("missing_ranks") or ()
        )
        comms.append(
            RasCommunicator(str(c.get("hash", "?")), int(c.get("size") or len(ranks)), ranks, missing)
        )
    ras = data.get("ras") or {}
    return RasSnapshot(
        t, str(data.get("nccl_version", "?")), tuple(comms), int(ras.get("timeouts_count") or 0)
    )


def _rank(r: dict[str, Any]) -> RasRank:
    status = r.get("status") or {}
    errors = []
    if status.get("async_error"):
        errors.append(f"async error {status['async_error']}")
    if status.get("abort_flag"):
        errors.append("aborted")
    if status.get("destroy_flag") or status.get("finalize_called"):
        errors.append("finalized")
    counts = tuple((str(k), int(v)) for k, v in (r.get("collective_counts") or {}).items())
    pid = r.get("pid")
    dev = r.get("cuda_dev")
    return RasRank(
        int(r.get("rank", -1)),
        str(r.get("host", "")),
        int(pid) if isinstance(pid, int) else None,
        int(dev) if isinstance(dev, int) else None,
        counts,
        tuple(errors),
    )
