"""The Ray boundary: the cluster's nodes and actors from the state API, stacks from the dashboard.

Plain HTTP to the dashboard (``--ray http://HEAD:8265``), no ``import ray``: a driver must match the
cluster's Ray and Python versions exactly, the HTTP API does not (multinode.md 1.3). Two reads:

* ``GET /api/v0/nodes`` and ``GET /api/v0/actors`` (``{"result": true, "data": {"result": {"result":
  [...]}}}``): every node (id, address, alive) and every actor (class, name, pid, node id, state), so a
  rank is (node, pid) with its role from the actor's class and its rank from its name.
* ``GET /worker/traceback?pid=P&node_id=N&native=0``: the head asks that node's agent to run
  ``py-spy dump`` and returns its text. Since Ray's PR #62531 (2.60 has it) every profiling endpoint
  answers 403 unless the head was started with ``RAY_DASHBOARD_ENABLE_PROFILING=1``; that answer is a
  ``TracebackOutcome.DISABLED`` which the caller says and falls back from (ssh to the node's address).

httpx's errors never leave this module: a dashboard that does not answer is a ``RayError`` (there is no
node to ask), one actor's failed traceback is that actor's outcome.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import httpx

from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import ThreadStack
from hangwatch.model.stacks import intern_frames

PROFILING_ENV = "RAY_DASHBOARD_ENABLE_PROFILING"
DEFAULT_TIMEOUT_S = 10.0
# The state API truncates at its own default (100); a vLLM cluster of 1,000 GPUs has as many actors.
LIST_LIMIT = 10_000


class RayError(Exception):
    """The dashboard could not be read: said to the user, there is no node to ask."""


@dataclass(frozen=True)
class RayNode:
    node_id: str
    address: str  # node_ip: where ssh reaches it
    name: str
    alive: bool
    head: bool


@dataclass(frozen=True)
class RayActor:
    actor_id: str
    class_name: str  # "RayWorkerWrapper", "RayWorkerProc", "SchedulerActor"
    name: str  # "" for an unnamed actor; vLLM 0.33: "vllm_Worker_<id>_TP3"
    pid: int  # as seen on its node (its PID namespace): meaningful only with node_id
    node_id: str
    state: str  # ALIVE, DEAD, PENDING_CREATION, RESTARTING
    namespace: str = ""


@dataclass(frozen=True)
class RayCluster:
    nodes: tuple[RayNode, ...]
    actors: tuple[RayActor, ...]
    elapsed_s: float  # both reads


class TracebackOutcome(StrEnum):
    OK = "ok"
    DISABLED = "disabled"  # 403: the head runs without RAY_DASHBOARD_ENABLE_PROFILING=1
    FAILED = "failed"  # the agent or py-spy failed (500 with its words), or the dashboard did not answer


@dataclass(frozen=True)
class Traceback:
    outcome: TracebackOutcome
    text: str  # py-spy dump's text (OK), or what the dashboard said
    elapsed_s: float


@dataclass(frozen=True)
class RayOptions:
    url: str  # the dashboard: http://HEAD:8265
    timeout_s: float = DEFAULT_TIMEOUT_S
    token: str | None = None  # RAY_AUTH_MODE=token clusters: sent as a Bearer token


def token_from_env() -> str | None:
    """Ray's own token places, read when asked (never stored): RAY_AUTH_TOKEN, its file, ~/.ray/auth_token."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or str(Path.home() / ".ray" / "auth_token")
    try:
        return Path(path).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def _client(o: RayOptions) -> httpx.Client:
    headers = {"Authorization": f"Bearer {o.token}"} if o.token else {}
    return httpx.Client(base_url=o.url.rstrip("/"), timeout=o.timeout_s, headers=headers, trust_env=False)


def _rows(client: httpx.Client, what: str) -> list[dict[str, Any]]:
    try:
        r = client.get(f"/api/v0/{what}", params={"limit": LIST_LIMIT, "detail": "1"})
    except httpx.HTTPError as exc:
        raise RayError(f"the Ray dashboard at {client.base_url} did not answer: {exc!s}"[:400]) from None
    if r.status_code in (401, 403):
        raise RayError(
            f"the Ray dashboard refused /api/v0/{what} (HTTP {r.status_code}): token auth? "
            "set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
        )
    if r.status_code != 200:
        raise RayError(f"/api/v0/{what}: HTTP {r.status_code}: {r.text[:300]}")
    try:
        body = r.json()
        rows = body["data"]["result"]["result"]
    except (ValueError, KeyError, TypeError):
        raise RayError(f"/api/v0/{what} is not the state API's answer: {r.text[:300]}") from None
    if not isinstance(rows, list):
        raise RayError(f"/api/v0/{what}: 'result' is not a list")
    return [row for row in rows if isinstance(row, dict)]


def discover(o: RayOptions) -> RayCluster:
    with _client(o) as client:
        start = _now()
        nodes = tuple(
            RayNode(
                node_id=str(n.get("node_id") or ""),
                address=str(n.get("node_ip") or ""),
                name=str(n.get("node_name") or n.get("node_ip") or ""),
                alive=n.get("state") == "ALIVE",
                head=bool(n.get("is_head_node")),
            )
            for n in _rows(client, "nodes")
        )
        actors = tuple(
            RayActor(
                actor_id=str(a.get("actor_id") or ""),
                class_name=str(a.get("class_name") or ""),
                name=str(a.get("name") or ""),
                pid=int(a.get("pid") or 0),
                node_id=str(a.get("node_id") or ""),
                state=str(a.get("state") or ""),
                namespace=str(a.get("ray_namespace") or ""),
            )
            for a in _rows(client, "actors")
        )
        return RayCluster(nodes, actors, round(_now() - start, 4))


def traceback(o: RayOptions, node_id: str, pid: int, native: bool = False) -> Traceback:
    """One process's py-spy dump through the head and that node's agent."""
    start = _now()
    params: dict[str, str | int] = {"pid": pid, "node_id": node_id, "native": int(native)}
    try:
        with _client(o) as client:
            # py-spy runs on the node: give it the whole timeout, not the state reads' share.
            r = client.get("/worker/traceback", params=params)
    except httpx.HTTPError as exc:
        return Traceback(
            TracebackOutcome.FAILED, f"the dashboard did not answer: {exc!s}"[:300], _now() - start
        )
    elapsed = round(_now() - start, 4)
    if r.status_code == 403:
        return Traceback(TracebackOutcome.DISABLED, r.text.strip()[:400], elapsed)
    if r.status_code != 200:
        return Traceback(TracebackOutcome.FAILED, f"HTTP {r.status_code}: {r.text.strip()[:300]}", elapsed)
    return Traceback(TracebackOutcome.OK, r.text, elapsed)


def _now() -> float:
    return time.monotonic()


# py-spy dump's text (the agent runs it without --json): "Thread 107 (idle): "MainThread"" and, leaf
# first, frames "    wait (threading.py:327)"; native frames have no line; locals are indented further.
_THREAD = re.compile(r'^Thread (0x[0-9a-fA-F]+|\d+) \((idle|active)(?:\+gil)?\)(?:: "(.*)")?')
_FRAME = re.compile(r"^    (\S.*?) \((.+?)(?::(\d+))?\)\s*$")


def parse_text_dump(text: str) -> tuple[ThreadStack, ...]:
    """py-spy's text dump to threads with frames outermost first (as the ``--json`` parser gives them)."""
    threads: list[ThreadStack] = []
    head: tuple[int, str | None, bool, bool] | None = None
    frames: list[Frame] = []

    def close() -> None:
        if head is not None:
            tid, name, active, gil = head
            threads.append(ThreadStack(tid, name, active, gil, intern_frames(list(reversed(frames)))))

    for line in text.splitlines():
        t = _THREAD.match(line)
        if t is not None:
            close()
            raw = t.group(1)
            tid = int(raw, 16) if raw.startswith("0x") else int(raw)
            head = (tid, t.group(3), t.group(2) == "active", "+gil" in line.split(":", 1)[0])
            frames = []
            continue
        f = _FRAME.match(line)
        if f is not None and head is not None:
            name, file, lineno = f.group(1), f.group(2), f.group(3)
            native = (lineno is None and file.endswith((".so", ".so.6"))) or ".so." in file
            frames.append(Frame(name, file, int(lineno) if lineno else 0, native=native))
    close()
    return tuple(threads)
