"""``stacks --ray URL``: the ranks from the Ray state API, their stacks from the dashboard or over ssh.

Discovery is the state API's (transports/ray.py): each worker actor is a rank, its (node, pid) from the
actor, its role from the actor's class, its rank from its name. Stacks: the dashboard's traceback
endpoint when the head allows it (one py-spy dump per actor, taken by that node's own agent: no ssh, no
hangwatch on the nodes); when it answers 403 (profiling disabled, the default since Ray 2.60) that is
said, and the collector runs over ssh on each node at the address the state API gave, for exactly that
node's actor pids; with ``--ray-task``, the nodes ssh did not reach get the collector as a node-pinned
Ray task (one Ray job: ``transports/ray.py:collect_by_task``). A node Ray calls dead, an actor that is
not alive, a dashboard that fails for one actor: evidence in that node's result, never a crash.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from dataclasses import replace

from hangwatch import __version__
from hangwatch.model.nodes import BUNDLE_SCHEMA
from hangwatch.model.nodes import BundleError
from hangwatch.model.nodes import ClockReading
from hangwatch.model.nodes import CollectMode
from hangwatch.model.nodes import NodeAnswer
from hangwatch.model.nodes import NodeBundle
from hangwatch.model.nodes import NodeIdentity
from hangwatch.model.nodes import NodeOutcome
from hangwatch.model.nodes import NodeProcess
from hangwatch.model.nodes import NodeResult
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import ProcessStacks
from hangwatch.model.stacks import StackSample
from hangwatch.nodes.gather import gather_ssh
from hangwatch.nodes.gather import result_of
from hangwatch.transports import ray
from hangwatch.transports.runner import fan_out
from hangwatch.transports.ssh import SshOptions
from hangwatch.transports.ssh import ssh_session
from hangwatch.transports.stream import StreamSession
from hangwatch.words import plural

# The actor classes that are an engine's ranks: vLLM's Ray executor (RayWorkerWrapper; RayWorkerProc in
# vLLM 0.33's RayExecutorV2) and SGLang --use-ray (SchedulerActor).
WORKER_CLASSES = ("RayWorkerWrapper", "RayWorkerProc", "SchedulerActor")
# vLLM 0.33 names its actors vllm_Worker_<id>_TP<r>_PP<p>; a name ending in a number carries the rank.
_RANK_IN_NAME = re.compile(r"(?:rank|_TP|_DP|_PP|[_-])(\d+)$", re.IGNORECASE)


@dataclass(frozen=True)
class RayRank:
    actor: ray.RayActor
    rank: int
    world_size: int


@dataclass(frozen=True)
class RayGathered:
    results: list[NodeResult]
    notes: tuple[str, ...]  # how the stacks were taken, and why (the 403 and what would lift it)
    discovery_s: float


def worker_ranks(cluster: ray.RayCluster, classes: Sequence[str]) -> list[RayRank]:
    """The engine's actors as ranks: by the rank in their names where every name has one, else in
    (node, name, pid) order; actors that are not alive are kept (their node says so)."""
    actors = [a for a in cluster.actors if a.class_name in classes]
    if not actors:
        return []
    numbers = [_RANK_IN_NAME.search(a.name) for a in actors]
    if all(numbers) and len({m.group(1) for m in numbers if m}) == len(actors):
        ranked = sorted(zip((int(m.group(1)) for m in numbers if m), actors, strict=True), key=lambda x: x[0])
    else:
        order = {n.node_id: i for i, n in enumerate(cluster.nodes)}
        by_place = sorted(actors, key=lambda a: (order.get(a.node_id, len(order)), a.name, a.pid))
        ranked = list(enumerate(by_place))
    return [RayRank(a, r, len(actors)) for r, a in ranked]


def gather_ray(
    options: ray.RayOptions,
    *,
    classes: Sequence[str],
    samples: int,
    every_s: float,
    native: bool,
    ssh: SshOptions,
    remote_args: Sequence[str],
    task: bool = False,
    task_python: str = ray.DEFAULT_PYTHON,
) -> RayGathered:
    """Every node's ranks, each node's stacks by the first route that reaches it, in this order:

    1. the dashboard's traceback endpoint (read-only, nothing runs but py-spy; needs profiling on);
    2. ssh to the node's address, the collector there (the user's own access; adds /proc readings);
    3. with ``task`` (``--ray-task``) only, for the nodes ssh did not reach: the collector as a
       node-pinned Ray task (code run inside the cluster as a Ray job, and a worker slot on each node:
       never by default, and after ssh because it needs the raylet that may itself be wedged).
    """
    cluster = ray.discover(options)
    ranks = worker_ranks(cluster, classes)
    notes: list[str] = []
    nodes = {n.node_id: n for n in cluster.nodes}
    by_node: dict[str, list[RayRank]] = {}
    for r in ranks:
        by_node.setdefault(r.actor.node_id, []).append(r)
    live = [r for r in ranks if r.actor.state == "ALIVE" and r.actor.pid > 0]
    via_dashboard = False
    if live:
        first = ray.traceback(options, live[0].actor.node_id, live[0].actor.pid, native)
        if first.outcome is ray.TracebackOutcome.DISABLED:
            notes.append(
                "the dashboard's traceback endpoint answered 403: profiling is disabled on this cluster "
                f"(Ray >= 2.60 default; the head would need {ray.PROFILING_ENV}=1 in its environment at "
                "'ray start --head'); stacks were taken over ssh to the node addresses Ray gave"
            )
        else:
            via_dashboard = True
            notes.append("stacks through the dashboard's /worker/traceback (py-spy run by each node's agent)")
    results: list[NodeResult] = []
    ssh_nodes: list[str] = []
    for node_id, node_ranks in by_node.items():
        node = nodes.get(node_id)
        host = node.address if node is not None else node_id[:12]
        if node is None or not node.alive:
            said = "not in the state API's node list" if node is None else "DEAD in the state API"
            results.append(
                silent_result(host, NodeOutcome.UNREACHABLE, f"Ray node {node_id[:12]} is {said}", node_ranks)
            )
            continue
        if via_dashboard:
            results.append(
                _from_dashboard(
                    options, node=node, ranks=node_ranks, samples=samples, every_s=every_s, native=native
                )
            )
        else:
            ssh_nodes.append(node_id)
    if ssh_nodes:
        hosts = [nodes[n].address for n in ssh_nodes]
        per_node = [
            [
                *remote_args,
                *[a for r in by_node[n] if r.actor.state == "ALIVE" for a in ("--pid", str(r.actor.pid))],
            ]
            for n in ssh_nodes
        ]
        # One ssh per node, each with its own pids: the fan-out of transports/ssh.py, host by host.
        got = fan_out(
            list(zip(hosts, per_node, strict=True)),
            lambda hp: gather_ssh([hp[0]], hp[1], ssh)[0],
            ssh.concurrency,
        )
        unreached = [
            (n, result) for n, result in zip(ssh_nodes, got, strict=True) if result.outcome in NOT_REACHED
        ]
        by_task: dict[str, NodeResult] = {}
        if unreached and task:
            args = dict(zip(ssh_nodes, per_node, strict=True))
            plans = [
                ray.TaskPlan(n, nodes[n].address, (*ssh.remote, "collect", *args[n])) for n, _ in unreached
            ]
            ssh_said = {n: r.outcome for n, r in unreached}
            by_task, note = _by_task(options, plans, ssh_said, ssh.node_timeout_s, task_python)
            notes.append(note)
        elif unreached:
            notes.append(
                f"ssh did not reach {len(unreached)} of {plural(len(ssh_nodes), 'Ray node')} "
                f"({', '.join(f'{nodes[n].address}: {r.outcome}' for n, r in unreached)}); "
                "--ray-task would run the collector there as a node-pinned Ray task instead"
            )
        for n, result in zip(ssh_nodes, got, strict=True):
            results.append(with_ranks(by_task.get(n, result), by_node[n]))
    return RayGathered(results, tuple(notes), cluster.elapsed_s)


# What ssh's outcome says about a node that the Ray task can still reach: the node was not read at all.
NOT_REACHED = frozenset(
    {
        NodeOutcome.REFUSED,
        NodeOutcome.AUTH,
        NodeOutcome.HOST_KEY,
        NodeOutcome.UNREACHABLE,
        NodeOutcome.TIMEOUT,
        NodeOutcome.NO_COLLECTOR,
    }
)


def _by_task(
    options: ray.RayOptions,
    plans: list[ray.TaskPlan],
    ssh_said: dict[str, NodeOutcome],
    timeout_s: float,
    python: str,
) -> tuple[dict[str, NodeResult], str]:
    """The nodes ssh did not reach, through one Ray job of node-pinned collector tasks; and its note."""
    start = time.monotonic()
    run = ray.collect_by_task(options, plans, timeout_s, python)
    took = time.monotonic() - start
    out = {p.node_id: result_of(a) for p, a in zip(plans, run.answers, strict=True)}
    said = ", ".join(f"{p.host} (ssh: {ssh_said[p.node_id]}; task: {out[p.node_id].outcome})" for p in plans)
    note = (
        f"ssh did not reach {plural(len(plans), 'Ray node')}; the collector ran there as a node-pinned Ray "
        f"task (--ray-task: Ray job {run.job} through the dashboard, {took:.1f} s, "
        f"{run.status or 'not started'}; it stays in the cluster's job list, and its log on the head holds "
        f"the bundles): {said}"
    )
    return out, note


def _role(actor: ray.RayActor) -> str:
    return f"ray_actor:{actor.class_name}"


def _process(r: RayRank) -> NodeProcess:
    return NodeProcess(
        pid=r.actor.pid,
        ppid=0,
        name=f"ray::{r.actor.class_name}",
        role=_role(r.actor),
        rank=str(r.rank),
        rank_source="ray_actor_name" if r.actor.name else "ray_actor_order",
        world_size=r.world_size,
        env={},
        cpu_cores=0.0,
    )


def with_ranks(result: NodeResult, ranks: list[RayRank]) -> NodeResult:
    """The collector's bundle with each actor's rank and role from Ray (the collector sees only titles)."""
    bundle = result.bundle
    if bundle is None:
        return result
    by_pid = {r.actor.pid: r for r in ranks}

    def proc(p: NodeProcess) -> NodeProcess:
        r = by_pid.get(p.pid)
        if r is None:
            return p
        return replace(
            p,
            role=_role(r.actor),
            rank=str(r.rank),
            rank_source=_process(r).rank_source,
            world_size=r.world_size,
        )

    def stacks(s: StackSample) -> StackSample:
        return replace(
            s,
            processes=tuple(
                replace(
                    p,
                    role=_role(by_pid[p.pid].actor),
                    rank=str(by_pid[p.pid].rank),
                    world_size=by_pid[p.pid].world_size,
                )
                if p.pid in by_pid
                else p
                for p in s.processes
            ),
        )

    errors = tuple(
        BundleError("select", f"actor {r.actor.name or r.actor.actor_id} is {r.actor.state}", r.actor.pid)
        for r in ranks
        if r.actor.state != "ALIVE"
    )
    return replace(
        result,
        bundle=replace(
            bundle,
            processes=tuple(proc(p) for p in bundle.processes),
            stacks=tuple(stacks(s) for s in bundle.stacks),
            errors=(*bundle.errors, *errors),
        ),
    )


def silent_result(host: str, outcome: NodeOutcome, detail: str, ranks: list[RayRank]) -> NodeResult:
    now = time.time()
    names = ", ".join(
        f"rank{r.rank} ({r.actor.name or r.actor.class_name}, pid {r.actor.pid})" for r in ranks
    )
    return NodeResult(host, outcome, f"{detail}; its actors: {names}", None, now, now)


def _from_dashboard(
    options: ray.RayOptions,
    *,
    node: ray.RayNode,
    ranks: list[RayRank],
    samples: int,
    every_s: float,
    native: bool,
) -> NodeResult:
    """One node's bundle from the dashboard: its actors as the state API gave them, py-spy's dumps as
    stacks; no /proc readings (the dashboard gives none), so no ticks."""
    sent, start = time.time(), time.monotonic()
    rounds: list[StackSample] = []
    errors: list[BundleError] = []
    alive = [r for r in ranks if r.actor.state == "ALIVE" and r.actor.pid > 0]
    for r in ranks:
        if r not in alive:
            errors.append(
                BundleError(
                    "select", f"actor {r.actor.name or r.actor.actor_id} is {r.actor.state}", r.actor.pid
                )
            )
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(alive)))) as pool:
        for i in range(samples):
            if i:
                time.sleep(every_s)
            t = round(time.monotonic() - start, 4)
            got = list(
                pool.map(lambda r: (r, ray.traceback(options, node.node_id, r.actor.pid, native)), alive)
            )
            rounds.append(
                StackSample(
                    t=t,
                    processes=tuple(_stacks_of(r, tb) for r, tb in got),
                    elapsed_s=round(time.monotonic() - start - t, 4),
                )
            )
    received = time.time()
    bundle = NodeBundle(
        schema=BUNDLE_SCHEMA,
        collector_version=f"hangwatch {__version__} via the Ray dashboard",
        mode=CollectMode.FULL,
        selector=f"ray actors on node {node.node_id[:12]}",
        node=NodeIdentity(hostname=node.name or node.address, boot_id="", pid_ns=_ns_of(node), kernel=""),
        clock=ClockReading(wall_s=sent, monotonic_s=start, duration_s=round(time.monotonic() - start, 4)),
        processes=tuple(_process(r) for r in ranks),
        ticks=(),
        stacks=tuple(rounds),
        errors=tuple(errors),
    )
    return NodeResult(node.address, NodeOutcome.OK, "", bundle, sent, received)


def _ns_of(node: ray.RayNode) -> int:
    """No /proc of the node here: a stable stand-in for its PID namespace, from its Ray node id."""
    return int(node.node_id[:12], 16) if re.fullmatch(r"[0-9a-f]{12,}", node.node_id[:12] or "x") else 0


def _stacks_of(r: RayRank, tb: ray.Traceback) -> ProcessStacks:
    base = ProcessStacks(
        pid=r.actor.pid,
        name=f"ray::{r.actor.class_name}",
        role=_role(r.actor),
        rank=str(r.rank),
        outcome=DumpOutcome.OK,
        world_size=r.world_size,
        elapsed_s=round(tb.elapsed_s, 4),
    )
    if tb.outcome is not ray.TracebackOutcome.OK:
        outcome = DumpOutcome.NO_DUMPER if "py-spy is not installed" in tb.text else DumpOutcome.FAILED
        detail = tb.text
        if outcome is DumpOutcome.NO_DUMPER:
            detail += " (py-spy must be on the PATH of that node's Ray agent: pip install py-spy there)"
        return replace(base, outcome=outcome, detail=detail)
    threads = ray.parse_text_dump(tb.text)
    if not threads:
        return replace(base, outcome=DumpOutcome.FAILED, detail=f"no threads in the dump: {tb.text[:200]}")
    return replace(base, threads=threads)


# -- attach --ray: a collector session per node -------------------------------------------------------

# Why a watch needs more than the dashboard: the state API has no CPU or thread readings and the
# traceback endpoint only stacks, so the census (the ticks the assessor judges progress by) must come
# from the collector on each node, over ssh to the address Ray gave.
SSH_NEEDED = (
    "attach --ray reads each node through `hangwatch collect --stream` over ssh to the address the state "
    "API gave (the dashboard has stacks but no CPU or thread readings to judge progress by)"
)


class SilentSession(StreamSession):
    """A node Ray itself calls dead (or with no live actor): no session to open; every round says why."""

    def __init__(self, host: str, detail: str) -> None:
        super().__init__(host, [], lambda ex: NodeAnswer(host, NodeOutcome.UNREACHABLE, detail, b"", 0, 0))
        self.detail = detail

    def ask(self, request: str, timeout_s: float) -> NodeAnswer:
        now = time.time()
        return NodeAnswer(self.host, NodeOutcome.UNREACHABLE, self.detail, b"", now, now)

    def close(self, grace_s: float = 2.0) -> None:
        return None


@dataclass(frozen=True)
class RayWatchTargets:
    hosts: tuple[str, ...]  # one per Ray node holding ranks, its node_ip (what ssh reaches)
    sessions: tuple[StreamSession, ...]  # in host order
    ranks: dict[str, list[RayRank]]  # host -> that node's ranks, to relabel each bundle with Ray's ranks
    discovery_s: float

    def finish(self, answer: NodeAnswer) -> NodeResult:
        ranks = self.ranks[answer.host]
        if answer.outcome is NodeOutcome.UNREACHABLE and not answer.stdout and answer.sent_wall_s == 0:
            return silent_result(answer.host, answer.outcome, answer.detail, ranks)
        result = result_of(answer)
        if result.bundle is None:
            # Which ranks this silence hides: the state API knows them even though the node said nothing.
            names = ", ".join(f"rank{r.rank} (pid {r.actor.pid})" for r in ranks)
            return replace(result, detail=f"{result.detail}; its actors: {names}")
        return with_ranks(result, ranks)


def ray_watch_targets(
    options: ray.RayOptions, classes: Sequence[str], ssh: SshOptions, stream_args: Sequence[str]
) -> RayWatchTargets:
    """The cluster's ranks from the state API, grouped by node; a ``collect --stream`` session on each
    node selecting exactly that node's actor pids (no --match: Ray gave the pids). Raises ``ray.RayError``."""
    cluster = ray.discover(options)
    nodes = {n.node_id: n for n in cluster.nodes}
    by_node: dict[str, list[RayRank]] = {}
    for r in worker_ranks(cluster, classes):
        by_node.setdefault(r.actor.node_id, []).append(r)
    hosts: list[str] = []
    sessions: list[StreamSession] = []
    ranks: dict[str, list[RayRank]] = {}
    for node_id, node_ranks in by_node.items():
        node = nodes.get(node_id)
        host = node.address if node is not None and node.address else node_id[:12]
        pids = [r.actor.pid for r in node_ranks if r.actor.state == "ALIVE" and r.actor.pid > 0]
        if node is None or not node.alive or not pids:
            said = (
                "not in the state API's node list"
                if node is None
                else "DEAD in the state API"
                if not node.alive
                else "without a live actor"
            )
            session: StreamSession = SilentSession(host, f"Ray node {node_id[:12]} is {said}")
        else:
            args = [a for pid in pids for a in ("--pid", str(pid))]
            session = ssh_session(host, [*args, *stream_args], ssh)
        hosts.append(host)
        sessions.append(session)
        ranks[host] = node_ranks
    return RayWatchTargets(tuple(hosts), tuple(sessions), ranks, cluster.elapsed_s)
