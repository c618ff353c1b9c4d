"""A watch across nodes as the one-node assessor sees it: each census round of every node is one ``Tick``.

The assessor (``assess.py``) compares a tick with the one before: CPU and I/O deltas, new processes,
exits. A census bundle's own deltas cover only its short window, so the deltas are computed here
again against the previous *round* of the same process (same node, same pid, same merge key), and
progress on any node is progress of the job.

A node that does not answer a round says nothing about its processes: they are carried as last seen,
with no deltas (no progress, and no death nor birth invented), and the node's silence is recorded as
evidence for the verdict (``NodeSilence``). A process gone from a node that did answer has ended; a
fresh collector cannot see its status, so it is a ``vanished`` exit, as on one machine.

Probes and GPUs: each node probes its engine's readiness URL on its own loopback; the answers join the
tick, except those the collector found to be SGLang's dummy health server (node ranks >= 1 answer 200
whatever the server does): those are never readiness nor progress, and are said once per node. GPUs
are numbered per node, so they are renumbered (node index x 1,000 + NVML index) and named with their node.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from urllib.parse import urlsplit

from hangwatch.analyse.logscan import TAIL_LINES
from hangwatch.analyse.logscan import LogScanner
from hangwatch.analyse.nodes import KEY_STRIDE
from hangwatch.analyse.nodes import relabel_stacks
from hangwatch.analyse.nodes import relabel_tick
from hangwatch.engines.profile import Profile
from hangwatch.model.nodes import NodeBundle
from hangwatch.model.nodes import NodeOutcome
from hangwatch.model.nodes import NodeResult
from hangwatch.model.nodes import NodeWatchSummary
from hangwatch.model.nodes import ProcessKey
from hangwatch.model.samples import ExitHow
from hangwatch.model.samples import ExitRecord
from hangwatch.model.samples import GpuProcessMemory
from hangwatch.model.samples import GpuReading
from hangwatch.model.samples import GpuSample
from hangwatch.model.samples import LogFinding
from hangwatch.model.samples import LogLines
from hangwatch.model.samples import LogSample
from hangwatch.model.samples import PhaseEvent
from hangwatch.model.samples import ProbeMarks
from hangwatch.model.samples import ProbeResult
from hangwatch.model.samples import ProcessSample
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import StackSample


@dataclass
class _NodeTrack:
    host: str
    label: str
    answered: int = 0
    failed: int = 0
    last: dict[int, ProcessSample] = field(default_factory=dict)  # merge key -> last seen
    silent_since: float | None = None
    last_outcome: NodeOutcome | None = None
    last_detail: str = ""
    events: list[str] = field(default_factory=list)
    pid_ns: int | None = None
    dummy: str | None = None  # why this node's probe answers are left out
    # The access-log text of the node's own probes (kept from the last round that said which): echoes.
    echoes: tuple[str, ...] = ()


class NodeRounds:
    """Census rounds of a fixed list of nodes folded into ticks with stable merge keys (node index).

    Nodes are named as the user (or the transport's discovery) named them: the host, the pod, the Slurm
    node. Hostnames could repeat (containers of one machine) and are learnt only as nodes answer, so a
    label taken from them could change in the middle of a watch.
    """

    def __init__(self, hosts: Sequence[str]) -> None:
        self.nodes = [_NodeTrack(h, h) for h in hosts]
        self.keys: dict[int, ProcessKey] = {}
        self.roots: set[int] = set()  # the topmost processes of each node at first answer

    def tick(self, t: float, results: Sequence[NodeResult]) -> Tick:
        """The merged tick at controller time ``t`` from one round (one result per host, in host order)."""
        processes: list[ProcessSample] = []
        exits: list[ExitRecord] = []
        probes: list[ProbeResult] = []
        gpus: list[tuple[int, str, GpuSample]] = []
        logs: list[LogLines] = []
        for index, (node, result) in enumerate(zip(self.nodes, results, strict=True)):
            node.last_outcome, node.last_detail = result.outcome, result.detail
            bundle = result.bundle
            if bundle is not None and bundle.follow:
                logs += _node_log(index, node, bundle)
            if bundle is None or not bundle.ticks:
                node.failed += 1
                if node.silent_since is None:
                    node.silent_since = t
                    node.events.append(
                        f"{node.label} stopped answering at {t:.1f} s"
                        f" ({result.outcome.value}): {result.detail}"
                    )
                # As last seen, nothing moved: silence is not progress, and not a death either.
                processes += [_still(p) for p in node.last.values()]
                continue
            if node.silent_since is not None:
                node.events.append(
                    f"{node.label} answered again at {t:.1f} s (silent since {node.silent_since:.1f} s)"
                )
                node.silent_since = None
            first_answer = node.answered == 0
            node.answered += 1
            node.pid_ns = bundle.node.pid_ns
            offset = (index + 1) * KEY_STRIDE
            seen = relabel_tick(bundle.ticks[-1], offset, node.label)
            now: dict[int, ProcessSample] = {}
            for p in seen.processes:
                old = node.last.get(p.pid)
                now[p.pid] = _since(p, old)
                self.keys[p.pid] = ProcessKey(node.label, bundle.node.pid_ns, p.pid - offset)
            if first_answer:
                self.roots |= {k for k, p in now.items() if p.ppid not in now}
            for key, old in node.last.items():
                if key not in now:
                    exits.append(ExitRecord(t, key, old.name, old.role, old.rank, ExitHow.VANISHED))
            node.last = now
            processes += now.values()
            for np in bundle.probes:
                if np.dummy is not None:
                    if node.dummy is None:
                        node.events.append(f"{node.label}: {np.probe.url} left out: {np.dummy}")
                    node.dummy = np.dummy
                    continue
                probes.append(replace(np.probe, t=t))
            if bundle.gpu is not None:
                gpus.append((index, node.label, bundle.gpu))
        return Tick(
            t=t,
            processes=tuple(processes),
            exits=tuple(exits),
            probes=tuple(probes),
            gpu=merge_gpus(gpus) if gpus else None,
            logs=tuple(logs),
        )

    def stacks(self, t: float, results: Sequence[NodeResult]) -> StackSample:
        """One capture round across nodes, stamped with the controller's tick time."""
        parts: list[StackSample] = []
        for index, (node, result) in enumerate(zip(self.nodes, results, strict=True)):
            if result.bundle is None or not result.bundle.stacks:
                continue
            parts.append(relabel_stacks(result.bundle.stacks[0], (index + 1) * KEY_STRIDE, node.label))
        return StackSample(
            t=t,
            processes=tuple(p for s in parts for p in s.processes),
            elapsed_s=max((s.elapsed_s for s in parts), default=0.0),
        )

    def events(self) -> list[str]:
        return [e for n in self.nodes for e in n.events]

    def summaries(self) -> tuple[NodeWatchSummary, ...]:
        return tuple(
            NodeWatchSummary(
                label=n.label,
                host=n.host,
                pid_ns=n.pid_ns,
                rounds_answered=n.answered,
                rounds_failed=n.failed,
                last_outcome=n.last_outcome or NodeOutcome.OK,
                last_detail=n.last_detail,
                silent_since_s=n.silent_since,
                processes=len(n.last),
                events=tuple(n.events),
            )
            for n in self.nodes
        )


def _node_log(index: int, node: _NodeTrack, bundle: NodeBundle) -> list[LogLines]:
    """The node's logs' news of the round, as one ``LogLines`` (none when they said nothing). Its own
    readiness probe is answered on its loopback: the access-log lines of its path (and of ``/v1/models``,
    asked to tell a dummy health server) are our echoes, as the paths of the round that last said them."""
    paths = {urlsplit(np.probe.url).path or "/" for np in bundle.probes}
    if paths:
        paths.add("/v1/models")
        node.echoes = tuple(sorted(f'"GET {path} HTTP' for path in paths))
    lines = tuple(line for f in bundle.follow for line in f.lines)
    grown = sum(f.new_bytes for f in bundle.follow)
    if not lines and not grown:
        return []
    omitted = sum(f.lines_omitted for f in bundle.follow)
    return [
        LogLines(lines, grown, marks=ProbeMarks(node.echoes), source=index, label=node.label, omitted=omitted)
    ]


class NodeLogs:
    """What the nodes' logs said in one round, as the one-node scanner reads its own log: the assessor's
    reader across nodes.

    One ``LogScanner`` per node (phases are tracked per writer, and writers are per node); the pids the
    lines name (vLLM's ``(Worker_TP1 pid=812)``) are that node's, so they move to the merge keys of the
    ticks. Lines arrive a round at a time, so only what they say marks echoes, not when they came.
    """

    def __init__(self, profile: Profile, ready_patterns: tuple[re.Pattern[str], ...] = ()) -> None:
        self._profile = profile
        self._ready = ready_patterns
        self._scanners: dict[int, LogScanner] = {}

    def read(self, tick: Tick) -> LogSample:
        parts: list[tuple[int, str, LogSample]] = []
        for log in tick.logs:
            scanner = self._scanners.get(log.source)
            if scanner is None:
                scanner = LogScanner(self._profile, self._ready)
                self._scanners[log.source] = scanner
            sample = scanner.scan(log.lines, log.new_bytes, tick.t, marks=log.marks)
            parts.append((log.source, log.label, replace(sample, new_lines=sample.new_lines + log.omitted)))
        return merge_logs(parts)


def merge_logs(parts: Sequence[tuple[int, str, LogSample]]) -> LogSample:
    """The nodes' log samples of one round as one: counts summed, pids moved to the merge keys, the
    lines quoted with their node."""
    if not parts:
        return LogSample()
    events: list[PhaseEvent] = []
    findings: list[LogFinding] = []
    named: list[tuple[int, str]] = []
    tail: list[str] = []
    last: str | None = None
    ready: str | None = None
    for index, label, log in parts:
        offset = (index + 1) * KEY_STRIDE
        events += [
            replace(e, source=_moved_source(e.source, offset), line=f"{label}: {e.line}")
            for e in log.phase_events
        ]
        findings += [
            replace(f, pid=None if f.pid is None else offset + f.pid, line=f"{label}: {f.line}")
            for f in log.findings
        ]
        named += [(offset + pid, title) for pid, title in log.named]
        tail += [f"{label}: {line}" for line in log.tail]
        last = f"{label}: {log.last_line}" if log.last_line is not None else last
        ready = ready or (f"{label}: {log.ready_line}" if log.ready_line is not None else None)
    return LogSample(
        new_bytes=sum(log.new_bytes for *_, log in parts),
        new_lines=sum(log.new_lines for *_, log in parts),
        waiting_lines=sum(log.waiting_lines for *_, log in parts),
        echo_lines=sum(log.echo_lines for *_, log in parts),
        phase_events=tuple(events),
        findings=tuple(findings),
        ready_line=ready,
        last_line=last,
        named=tuple(named),
        tail=tuple(tail[-TAIL_LINES:]),
    )


def _moved_source(source: str | None, offset: int) -> str | None:
    if source is not None and source.startswith("pid:") and source[4:].isdigit():
        return f"pid:{offset + int(source[4:])}"
    return source  # a rank ("rank:TP1") is the job's, not the node's


def _since(p: ProcessSample, old: ProcessSample | None) -> ProcessSample:
    """The deltas since the previous round of the same process (0 at first sight, as TreeSampler does)."""
    if old is None:
        return replace(p, cpu_delta_s=0.0, io_delta_bytes=0)
    io = 0
    if p.rchar is not None and p.wchar is not None and old.rchar is not None and old.wchar is not None:
        io = max(0, p.rchar + p.wchar - old.rchar - old.wchar)
    return replace(p, cpu_delta_s=round(max(0.0, p.cpu_s - old.cpu_s), 4), io_delta_bytes=io)


def _still(p: ProcessSample) -> ProcessSample:
    return replace(p, cpu_delta_s=0.0, io_delta_bytes=0)


GPU_STRIDE = 1000  # GPUs per node in the merged numbering: far above any node's count


def merge_gpus(parts: Sequence[tuple[int, str, GpuSample]]) -> GpuSample:
    """Every node's GPUs in one sample: renumbered per node, named with it; processes keyed like the ticks.

    NVML gives host pids; where the node's processes live in another pid namespace (a container) they
    will not match the ticks' pids, which only costs the per-process GPU memory join, not a reading.
    """
    readings: list[GpuReading] = []
    processes: list[GpuProcessMemory] = []
    unavailable: list[str] = []
    errors: list[str] = []
    for index, label, sample in parts:
        base = (index + 1) * GPU_STRIDE
        if sample.unavailable:
            unavailable.append(f"{label}: {sample.unavailable}")
            continue
        if sample.error:
            errors.append(f"{label}: {sample.error}")
        readings += [replace(g, index=base + g.index, name=f"{label}:{g.name}") for g in sample.gpus]
        processes += [
            replace(p, pid=(index + 1) * KEY_STRIDE + p.pid, gpu_index=base + p.gpu_index)
            for p in sample.processes
        ]
    return GpuSample(
        # Unavailable only when no node could read one: a node without GPUs beside GPU nodes is normal.
        unavailable="; ".join(unavailable) if not readings and unavailable else None,
        gpus=tuple(readings),
        processes=tuple(processes),
        error="; ".join(errors) or None,
    )
