"""``hangwatch attach --hosts ...``: the one-node watch over a job that spans nodes, read-only everywhere.

Each interval, one census round: the collector in ``census`` mode on every node at once (processes,
ranks, CPU; no stacks, a 0.1 s window), through one ``collect --stream`` session per node kept open for
the whole watch (the handshake and the remote interpreter's start are paid once), folded into one tick
with stable merge keys (``analyse/nodewatch.py``) and handed to the same ``Assessor`` the one-node
attach uses, through the same seam: ``observe(tick)``, ``stacks_wanted()``, ``observe_stacks(sample)``.
When the assessor asks for stacks (the job went quiet), a full round with one stack sample per rank
follows at once. So progress on any node is progress of the job, and the cause rules see every rank
together: a rank on node 3 that stopped joining the collective is the odd one out of the job, named with
its node.

A node that stops answering is evidence (when, and why: refused, timeout, auth), never a crash; its
processes stay as last seen, with no progress. Each node probes its engine's readiness URL on its own
loopback (or ``--ready-url``, probed on every node), so node 0's real /health can make the job
``ready``; SGLang's dummy health server on node ranks >= 1 (always 200) is recognised on the node and
never counted. Each node's logs (the roots' stdout/stderr where those are files, and ``--log``) are
followed from the moment the watch starts: each census carries the lines they gained, read by one log
scanner per node (``analyse/nodewatch.py:NodeLogs``), so phases, exceptions and new lines count across
nodes as on one.

One machine under two of the names --hosts gave (``localhost,127.0.0.1``; the same boot id, pid
namespace and selection in the first answers) is watched once, under the name that answered first, and
said in the report's notes: read twice, its ranks would count twice and each collector's stack captures
would show the other's pauses as stopped processes (``nodes/samemachine.py``).
"""

from __future__ import annotations

import dataclasses
import re
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from hangwatch import engines
from hangwatch.analyse import causes
from hangwatch.analyse.assess import Assessor
from hangwatch.analyse.assess import nodes_unanswered
from hangwatch.analyse.assess import nodes_unreadable
from hangwatch.analyse.assess import watch_policy
from hangwatch.analyse.nodewatch import NodeLogs
from hangwatch.analyse.nodewatch import NodeRounds
from hangwatch.analyse.stacktree import build_tree
from hangwatch.analyse.stackwatch import StackHistory
from hangwatch.errors import NoTargets
from hangwatch.errors import UsageError
from hangwatch.model.nodes import NODES_WATCH_SCHEMA
from hangwatch.model.nodes import NodeAnswer
from hangwatch.model.nodes import NodeOutcome
from hangwatch.model.nodes import NodeResult
from hangwatch.model.nodes import NodesWatchReport
from hangwatch.model.nodes import RoundCost
from hangwatch.model.report import Verdict
from hangwatch.model.stacks import paused_gc
from hangwatch.model.status import StackRequest
from hangwatch.model.vocabulary import CLI_WORDS
from hangwatch.model.vocabulary import State
from hangwatch.nodes.gather import in_pod
from hangwatch.nodes.gather import job_nodes
from hangwatch.nodes.gather import result_of
from hangwatch.nodes.gather import selected_pods
from hangwatch.nodes.ray import SSH_NEEDED
from hangwatch.nodes.ray import WORKER_CLASSES
from hangwatch.nodes.ray import ray_watch_targets
from hangwatch.nodes.samemachine import MachineIndex
from hangwatch.nodes.samemachine import SameMachine
from hangwatch.nodes.samemachine import left_out_result
from hangwatch.pacing import Pacer
from hangwatch.redact import scrub
from hangwatch.render.files import write_atomically
from hangwatch.render.files import write_outputs
from hangwatch.render.json_report import json_text
from hangwatch.render.json_report import plain
from hangwatch.render.live import make_view
from hangwatch.render.nodes_text import nodes_watch_text
from hangwatch.transports import kubectl
from hangwatch.transports import ray as ray_transport
from hangwatch.transports import slurm
from hangwatch.transports.runner import Exchange
from hangwatch.transports.ssh import SshOptions
from hangwatch.transports.ssh import ssh_session
from hangwatch.transports.stream import StreamSession
from hangwatch.transports.stream import StreamSessions

LOG_TAIL_KEPT = 30  # the nodes' last log lines the report keeps
CENSUS_WINDOW_S = 0.1  # the collector's own window; the deltas that matter are between rounds
# A census round must not wait 30 s on a node that accepts and never answers: a few intervals at most.
CENSUS_TIMEOUT_MIN_S = 4.0


class Fanout(Protocol):
    """One round on every node, one result per node in host order (the ssh sessions, or a test's fake)."""

    def census(self) -> list[NodeResult]: ...

    def stacks(self, native: bool) -> list[NodeResult]: ...

    def drop(self, index: int, detail: str) -> None:
        """Stop asking node ``index`` (another name of a machine already watched); it answers ``detail``."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class NodesAttachOptions:
    hosts: tuple[str, ...]
    match: str
    engine: str | None
    window_s: float
    stall_after_s: float
    ready_url: str | None
    interval_s: float
    stacks: bool
    quiet: bool
    ssh: SshOptions
    report_json: Path | None
    kube: kubectl.KubectlOptions | None = None  # pods by label selector instead of hosts
    kube_selector: str | None = None
    slurm: slurm.SlurmOptions | None = None  # the nodes of a running Slurm job instead of hosts
    ray: ray_transport.RayOptions | None = None  # the nodes and actor pids from a Ray dashboard
    ray_classes: tuple[str, ...] = WORKER_CLASSES
    # Followed on every node besides the roots' stdout/stderr files: the same path on each (a shared or
    # per-node file); a line that by itself means ready.
    log: Path | None = None
    ready_pattern: re.Pattern[str] | None = None

    @property
    def selector(self) -> str:
        if self.ray is not None:
            return f"--ray {self.ray.url}, actors {'|'.join(self.ray_classes)}"
        return f"--match {self.match!r}"

    @property
    def hosts_given(self) -> bool:
        """The nodes are names from --hosts/--hostfile, two of which may be one machine; pods, a job's
        nodes and Ray's nodes are discovered, each its own."""
        return self.kube is None and self.slurm is None and self.ray is None

    @property
    def node_timeout_s(self) -> float:
        return (self.kube or self.slurm or self.ssh).node_timeout_s

    @property
    def connect_timeout_s(self) -> float:
        return (self.kube or self.slurm or self.ssh).connect_timeout_s


def stream_args(o: NodesAttachOptions) -> list[str]:
    """The collector's options for the whole watch; each request line then says census or full."""
    deadline = max(1.0, o.node_timeout_s - o.connect_timeout_s - min(3.0, o.node_timeout_s / 4))
    # Ray gives each node's actor pids (ray_watch_targets adds them): no pattern to match there.
    args = [] if o.ray is not None else ["--match", o.match]
    args += ["--every", f"{CENSUS_WINDOW_S:g}", "--deadline", f"{deadline:g}"]
    args += ["--probe-url", o.ready_url] if o.ready_url else []
    args += ["--log", str(o.log)] if o.log is not None else []
    return args + (["--engine", o.engine] if o.engine else [])


def census_timeout(o: NodesAttachOptions) -> float:
    return min(o.node_timeout_s, max(CENSUS_TIMEOUT_MIN_S, 3 * o.interval_s))


class StreamFanout:
    """One ``collect --stream`` session per node, through whichever transport reaches the nodes."""

    def __init__(
        self,
        o: NodesAttachOptions,
        sessions: StreamSessions,
        finish: Callable[[NodeAnswer], NodeResult] = result_of,
    ) -> None:
        self.o, self.sessions, self.finish = o, sessions, finish

    # A round's answers decoded with the garbage collector paused, as a one-shot fan-out's (nodes/gather.py).
    def census(self) -> list[NodeResult]:
        with paused_gc:
            return self.sessions.ask("census", census_timeout(self.o), self.finish)

    def stacks(self, native: bool) -> list[NodeResult]:
        with paused_gc:
            return self.sessions.ask("full-native" if native else "full", self.o.node_timeout_s, self.finish)

    def drop(self, index: int, detail: str) -> None:
        # Closed now, so its collector never takes a stack round beside the kept name's.
        session = self.sessions.sessions[index]
        session.close()
        self.sessions.sessions[index] = LeftOutSession(session.host, detail)

    def close(self) -> None:
        self.sessions.close()


class LeftOutSession(StreamSession):
    """A name left out of the watch: nothing to open, never asked; every round says why."""

    def __init__(self, host: str, detail: str) -> None:
        def answer(ex: Exchange) -> NodeAnswer:
            return NodeAnswer(host, NodeOutcome.REMOTE_ERROR, detail, b"", ex.sent_wall_s, ex.received_wall_s)

        super().__init__(host, [], answer)

    def ask(self, request: str, timeout_s: float) -> NodeAnswer:
        now = time.time()
        return self.answer(Exchange(None, b"", "", now, now))

    def close(self, grace_s: float = 2.0) -> None:
        return None


def make_assessor(o: NodesAttachOptions, roots: set[int], first_cmdline: tuple[str, ...]) -> Assessor:
    profile = engines.by_name(o.engine) if o.engine else engines.detect(first_cmdline or ("?",))
    policy = watch_policy(
        profile,
        stall_after_s=o.stall_after_s,
        window_s=o.window_s,
        ready_url=o.ready_url,
        ready_pattern=o.ready_pattern is not None,
        across_nodes=True,
        words=CLI_WORDS,
    )
    # ``roots`` is filled as nodes first answer; the assessor keeps the same set. It reads the nodes' logs.
    ready = (o.ready_pattern,) if o.ready_pattern is not None else ()
    return Assessor(profile, policy, roots, StackHistory() if o.stacks else None, NodeLogs(profile, ready))


class NodesWatch:
    """The loop; the fan-out and the clock are injectable so the loop can be tested without ssh."""

    def __init__(
        self,
        o: NodesAttachOptions,
        fanout: Fanout,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.o, self.fanout, self.clock, self.sleep = o, fanout, clock, sleep
        self.rounds = NodeRounds(o.hosts)
        self.assessor: Assessor | None = None
        self.log_tail: deque[str] = deque(maxlen=LOG_TAIL_KEPT)
        self.round_s: list[float] = []
        self.stack_round_s: list[float] = []
        self.view = make_view(o.quiet, sys.stderr)
        self._events_shown = 0
        self.machines = MachineIndex()
        self.left_out: dict[int, SameMachine] = {}  # node index -> the name it is the same machine as

    def _sleep_for(self, delay: float) -> bool:
        if delay > 0:
            self.sleep(delay)
        return False  # a stop is Ctrl-C, raised in the loop

    def run(self) -> Verdict:
        start = self.clock()
        pacer = Pacer(self.o.interval_s, self._sleep_for, self.clock)
        try:
            while True:
                began = self.clock()
                results = self._once_per_machine(self.fanout.census())
                ended = self.clock()
                self.round_s.append(ended - began)
                t = round((began + ended) / 2 - start, 3)
                tick = self.rounds.tick(t, results)
                self._show_events()
                if self.assessor is None:
                    if not tick.processes:
                        unreadable = ray_unreadable_verdict(self.o, results)
                        if unreadable is not None:
                            return unreadable
                        if t >= self.o.window_s:
                            return no_answer_verdict(self.o)
                        pacer.wait()  # nothing answered with a process yet
                        continue
                    roots = [p for p in tick.processes if p.pid in self.rounds.roots]
                    self.assessor = make_assessor(
                        self.o, self.rounds.roots, roots[0].cmdline if roots else ()
                    )
                verdict = self.assessor.observe(tick)
                read = self.assessor.status().tick
                if read is not None:
                    self.log_tail.extend(read.log.tail)
                request = self.assessor.stacks_wanted()
                if request is not StackRequest.NONE:
                    verdict = self._stacks(t, request) or verdict
                if verdict is not None and (verdict.state is not State.READY or self.assessor.window_over):
                    return verdict
                pacer.wait()
        except KeyboardInterrupt:
            if self.assessor is None:
                raise
            return self.assessor.interrupted()
        finally:
            self.view.close()

    def _stacks(self, t: float, request: StackRequest) -> Verdict | None:
        assert self.assessor is not None
        began = self.clock()
        results = self._without_left_out(self.fanout.stacks(request is StackRequest.NATIVE))
        self.stack_round_s.append(self.clock() - began)
        sample = self.rounds.stacks(t, results)
        if not sample.processes:
            return None  # no node gave stacks: the verdict waits for the next round
        tree = build_tree([sample])
        self.view.event(f"{t:.1f}s quiet: took stacks across nodes: {tree.summary[:300]}")
        return self.assessor.observe_stacks(sample)

    def _once_per_machine(self, results: list[NodeResult]) -> list[NodeResult]:
        """At each name's first answer (a census: no capture yet), another name of a machine already
        watched is left out: its session closed, its rounds never counted, its processes never merged."""
        for same in self.machines.observe(results) if self.o.hosts_given else ():
            self.left_out[same.index] = same
            note = same.note("watched once")
            self.fanout.drop(same.index, note)
            self.view.event(note)
        return self._without_left_out(results)

    def _without_left_out(self, results: list[NodeResult]) -> list[NodeResult]:
        return [
            left_out_result(r, self.left_out[i]) if i in self.left_out else r for i, r in enumerate(results)
        ]

    def _events(self) -> list[str]:
        """The nodes' events, without the names left out (their "silence" is only that)."""
        return [e for i, n in enumerate(self.rounds.nodes) if i not in self.left_out for e in n.events]

    def _show_events(self) -> None:
        events = self._events()
        for e in events[self._events_shown :]:
            self.view.event(e)
        self._events_shown = len(events)

    def report(self, verdict: Verdict, duration_s: float) -> NodesWatchReport:
        # The nodes' silences are evidence too; the advice to take stacks is not (they were, on every node).
        verdict = replace(
            verdict,
            evidence=(*self._events(), *verdict.evidence),
            next_steps=causes.steps_after_stacks(verdict.next_steps),
        )
        tree = self.assessor.stack_tree(verdict) if self.assessor is not None else None
        return NodesWatchReport(
            schema=NODES_WATCH_SCHEMA,
            selector=self.o.selector,
            verdict=verdict,
            duration_s=round(duration_s, 3),
            nodes=tuple(n for i, n in enumerate(self.rounds.summaries()) if i not in self.left_out),
            processes=dict(self.rounds.keys),
            cost=RoundCost(
                rounds=len(self.round_s),
                median_s=round(statistics.median(self.round_s), 3) if self.round_s else 0.0,
                max_s=round(max(self.round_s, default=0.0), 3),
                stack_rounds=len(self.stack_round_s),
                stack_median_s=round(statistics.median(self.stack_round_s), 3) if self.stack_round_s else 0.0,
            ),
            stack_tree=tree,
            log_tail=tuple(self.log_tail),
            notes=tuple(self.left_out[i].note("watched once") for i in sorted(self.left_out)),
        )


def no_answer_verdict(o: NodesAttachOptions) -> Verdict:
    return nodes_unanswered(o.selector, o.window_s, CLI_WORDS)


# Outcomes that waiting does not cure: the user has to start sshd, fix a key, install hangwatch there.
NEEDS_THE_USER = frozenset(
    {
        NodeOutcome.REFUSED,
        NodeOutcome.AUTH,
        NodeOutcome.HOST_KEY,
        NodeOutcome.NO_COLLECTOR,
        NodeOutcome.UNREACHABLE,
    }
)


def ray_unreadable_verdict(o: NodesAttachOptions, results: Sequence[NodeResult]) -> Verdict | None:
    """Across a Ray cluster the ranks already exist (the state API listed them alive), so when no node
    can be read for a reason waiting does not cure (no sshd on any node, most often: Ray needs none) the
    watch ends at once saying so, instead of waiting out --window for processes it will never see."""
    if o.ray is None or not results or any(r.bundle is not None for r in results):
        return None
    if not all(r.outcome in NEEDS_THE_USER for r in results):
        return None
    return nodes_unreadable(
        f"no node of the Ray cluster could be read: {SSH_NEEDED}",
        tuple(f"{r.host}: {r.outcome.value}: {r.detail}" for r in results),
        (
            "start sshd on the Ray nodes (or give --ssh-config / --ssh-option for how to reach them), with "
            "hangwatch installed there (--remote-hangwatch CMD)",
            f"for stacks only, `hangwatch stacks --ray {o.ray.url}` uses the dashboard's traceback endpoint "
            f"where the head runs with {ray_transport.PROFILING_ENV}=1",
        ),
    )


def open_fanout(o: NodesAttachOptions) -> tuple[NodesAttachOptions, StreamFanout]:
    """The nodes (hosts as given, the selector's pods, the job's nodes) and a session on each."""
    args = stream_args(o)
    if o.kube is not None and o.kube_selector is not None:
        pods = selected_pods(o.kube_selector, o.kube)
        by_name = {p.name: p for p in pods}
        sessions = StreamSessions(
            [kubectl.kubectl_session(p, args, o.kube) for p in pods], o.kube.concurrency
        )
        o = replace(o, hosts=tuple(by_name))
        return o, StreamFanout(o, sessions, lambda a: in_pod(by_name[a.host], result_of(a)))
    if o.ray is not None:
        try:
            targets = ray_watch_targets(o.ray, o.ray_classes, o.ssh, args)
        except ray_transport.RayError as exc:
            raise NoTargets(f"ray: {exc}") from None
        if not targets.hosts:
            raise NoTargets(f"no actor of class {', '.join(o.ray_classes)} in the Ray cluster at {o.ray.url}")
        o = replace(o, hosts=targets.hosts)
        sessions = StreamSessions(list(targets.sessions), o.ssh.concurrency)
        return o, StreamFanout(o, sessions, targets.finish)
    if o.slurm is not None:
        nodes = job_nodes(o.slurm)
        sessions = StreamSessions([slurm.srun_session(n, args, o.slurm) for n in nodes], o.slurm.concurrency)
        o = replace(o, hosts=tuple(nodes))
        return o, StreamFanout(o, sessions)
    if not o.hosts:
        raise UsageError("--hosts/--hostfile named no node")
    return o, StreamFanout(
        o, StreamSessions([ssh_session(h, args, o.ssh) for h in o.hosts], o.ssh.concurrency)
    )


def attach_across_nodes(o: NodesAttachOptions) -> int:
    o, fanout = open_fanout(o)
    watch = NodesWatch(o, fanout)
    started = time.monotonic()
    try:
        verdict = watch.run()
    finally:
        fanout.close()
    report = watch.report(verdict, time.monotonic() - started)
    print(scrub(nodes_watch_text(report)), flush=True)
    if o.report_json is not None:
        data = plain(dataclasses.asdict(report))
        write_outputs(
            [("--report-json", o.report_json, lambda path: write_atomically(path, json_text(data)))]
        )
    return verdict.exit_code
