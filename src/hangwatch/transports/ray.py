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
* ``POST /api/jobs/`` (opt-in, ``--ray-task``): a Ray job whose driver (``ray_node_task.py``, sent as
  its entrypoint's source) runs the collector on each chosen node as a node-pinned task; its answers come
  back through ``GET /api/jobs/ID/logs``; the job stays listed (see collect_by_task). Code run inside
  the cluster, so never without being asked.

httpx's errors never leave this module: a dashboard that does not answer is a ``RayError`` (there is no
node to ask), one actor's failed traceback is that actor's outcome.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import time
import uuid
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import httpx

from hangwatch.model.nodes import NodeAnswer
from hangwatch.model.nodes import NodeOutcome
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


# -- the collector as node-pinned Ray tasks (--ray-task) ----------------------------------------------

_DRIVER = Path(__file__).with_name("ray_node_task.py")
# The entrypoint's shell runs the driver with the cluster's own Python (the one with Ray): `python` on
# the PATH of Ray's job supervisor, i.e. of `ray start` on the head (an activated venv, an image's), or
# --ray-python. Checked with 2.60: a head started as /venv/bin/ray from a shell without the venv on PATH
# gives the system python, "No module named 'ray'". The source and the plan travel base64-encoded, so no
# node-derived string is ever quoted for a shell.
_EXEC = "-c 'import base64,sys;exec(base64.b64decode(sys.argv[1]))'"
DEFAULT_PYTHON = "python"
_TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


@dataclass(frozen=True)
class TaskPlan:
    node_id: str
    host: str  # the node's address, which its answer is filed under
    argv: tuple[str, ...]  # the collector's command on that node


@dataclass(frozen=True)
class TaskJob:
    answers: list[NodeAnswer]  # one per plan, in plan order
    job: str  # the Ray job's submission id
    # How the job ended (SUCCEEDED, FAILED, STOPPED: stopped at our deadline). It stays in the cluster's
    # job list, as every Ray job does: see the note at collect_by_task.
    status: str = ""


def collect_by_task(
    o: RayOptions, plans: list[TaskPlan], timeout_s: float, python: str = DEFAULT_PYTHON
) -> TaskJob:
    """The collector on each planned node through one Ray job of node-pinned tasks; one answer per plan.

    The job's own failure (refused, not started in time, the driver's Python without Ray) is every
    planned node's answer, with what the job's log said.

    The job is left in the cluster's job list, not deleted: it ran code in the cluster, which its users
    should be able to see (metadata ``hangwatch: collect``); and a delete is not safe. Ray 2.60's job
    manager notices the supervisor's exit up to a monitor period later and then reads the job's status:
    found deleted, it records the job FAILED ("Job supervisor actor died", ``put_status`` re-creating the
    info: ``dashboard/modules/job/job_manager.py`` and ``common.py:put_status``), seen here as a job that
    came back after a DELETE answered 200. Deleting would not remove its log on the head either."""
    sent = time.time()
    # A job's supervisor and driver start (a Python with Ray, ray.init) before any task: 10-20 s here.
    budget = timeout_s + 40
    plan = {"timeout_s": timeout_s, "nodes": [{"node_id": p.node_id, "argv": list(p.argv)} for p in plans]}
    script = base64.b64encode(_DRIVER.read_bytes()).decode("ascii")
    encoded = base64.b64encode(json.dumps(plan).encode()).decode("ascii")
    job = f"hangwatch-collect-{uuid.uuid4().hex[:12]}"
    body = {
        "entrypoint": f"{shlex.quote(python)} {_EXEC} {script} {encoded}",
        "submission_id": job,
        "metadata": {"hangwatch": "collect", "nodes": str(len(plans))},
        "entrypoint_num_cpus": 0,
    }

    def every(outcome: NodeOutcome, detail: str) -> TaskJob:
        return TaskJob(
            [NodeAnswer(p.host, outcome, detail[:600], b"", sent, time.time()) for p in plans], job
        )

    try:
        with _client(RayOptions(o.url, max(o.timeout_s, 15.0), o.token)) as client:
            r = client.post("/api/jobs/", json=body)
            if r.status_code != 200:
                outcome = NodeOutcome.AUTH if r.status_code in (401, 403) else NodeOutcome.REMOTE_ERROR
                return every(outcome, f"the dashboard refused the collector's Ray job: HTTP {r.status_code}: "
                             f"{r.text.strip()[-300:]}")  # fmt: skip
            deadline = _now() + budget
            status, message = "PENDING", ""
            while _now() < deadline:
                info = client.get(f"/api/jobs/{job}")
                if info.status_code == 200:
                    data = info.json()
                    status, message = str(data.get("status")), str(data.get("message") or "")
                    if status in _TERMINAL:
                        break
                time.sleep(0.5)
            logs = ""
            got = client.get(f"/api/jobs/{job}/logs")
            if got.status_code == 200:
                logs = str(got.json().get("logs") or "")
            if status not in _TERMINAL:
                client.post(f"/api/jobs/{job}/stop")
    except (httpx.HTTPError, ValueError) as exc:
        return every(NodeOutcome.TIMEOUT, f"the dashboard stopped answering about Ray job {job}: {exc!s}")
    answers = task_answers(plans, logs, sent)
    missing = [a for a in answers if a is None]
    if missing:
        tail = " | ".join(line for line in logs.strip().splitlines()[-3:])[-400:]
        if status not in _TERMINAL:
            why = f"Ray job {job} did not finish within {budget:g} s (status {status}); stopped"
            outcome = NodeOutcome.TIMEOUT
        else:
            why = f"Ray job {job} ended {status} without this node's answer: {message}"
            if "No module named 'ray'" in logs:
                why += (
                    f" ({python!r} on the head has no Ray: give the cluster's interpreter with --ray-python, "
                    "e.g. the venv's bin/python that `ray start` ran from)"
                )
            outcome = NodeOutcome.REMOTE_ERROR
        filled = NodeAnswer("", outcome, f"{why}; its log: {tail}", b"", sent, time.time())
        return TaskJob(
            [a or _with_host(filled, p.host) for a, p in zip(answers, plans, strict=True)], job, status
        )
    return TaskJob([a for a in answers if a is not None], job, status)


def _with_host(a: NodeAnswer, host: str) -> NodeAnswer:
    return NodeAnswer(host, a.outcome, a.detail, a.stdout, a.sent_wall_s, a.received_wall_s)


def task_answers(plans: list[TaskPlan], logs: str, sent: float) -> list[NodeAnswer | None]:
    """The driver's result lines (``ray_node_task.RESULT_TAG``) as each plan's answer; None where none."""
    from hangwatch.transports.ray_node_task import RESULT_TAG

    by_node: dict[str, dict[str, Any]] = {}
    for line in logs.splitlines():
        if line.startswith(RESULT_TAG):
            try:
                row = json.loads(line[len(RESULT_TAG) :])
            except ValueError:
                continue
            if isinstance(row, dict):
                by_node[str(row.get("node_id"))] = row
    received = time.time()
    out: list[NodeAnswer | None] = []
    for p in plans:
        row = by_node.get(p.node_id)
        if row is None:
            out.append(None)
            continue
        rc, stderr = int(row.get("rc", -2)), str(row.get("stderr") or "").strip()
        where = f"the collector's Ray task on node {p.node_id[:12]}"
        if rc == 0:
            stdout = base64.b64decode(str(row.get("stdout") or ""))
            out.append(NodeAnswer(p.host, NodeOutcome.OK, "", stdout, sent, received))
        elif rc in (126, 127):
            detail = f"{where}: hangwatch was not found there ({' '.join(p.argv[:3])}...): {stderr[-300:]}"
            out.append(NodeAnswer(p.host, NodeOutcome.NO_COLLECTOR, detail, b"", sent, received))
        elif rc == -1:
            out.append(NodeAnswer(p.host, NodeOutcome.TIMEOUT, f"{where}: {stderr}", b"", sent, received))
        else:
            detail = f"{where} failed (exit {rc}): {stderr[-400:]}"
            out.append(NodeAnswer(p.host, NodeOutcome.REMOTE_ERROR, detail, b"", sent, received))
    return out


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
