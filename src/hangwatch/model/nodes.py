"""Evidence from several nodes: the per-node bundle (schema ``hangwatch.node-bundle/2``), what a transport
made of each node, and the merged view across nodes.

The bundle carries the very samples the local analysis consumes (``Tick``s of ``ProcessSample``s and
``StackSample``s of ``ProcessStacks``), so one analysis serves one node and many: the bundle decodes
back into those frozen objects (``nodes/codec.py``). What only a multi-node report needs (identity,
clock, where a rank came from, thread states, log tails, errors) sits beside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from hangwatch.model.report import Verdict
from hangwatch.model.rulebook import NearMiss
from hangwatch.model.samples import GpuSample
from hangwatch.model.samples import ProbeResult
from hangwatch.model.samples import ProcState
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import StackTree
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import Confidence

# /2: /1 with each distinct stack written once (nodes/codec.py); /1 is still read.
BUNDLE_SCHEMA = "hangwatch.node-bundle/2"
BUNDLE_SCHEMA_V1 = "hangwatch.node-bundle/1"
NODES_REPORT_SCHEMA = "hangwatch.stacks-nodes/1"
NODES_WATCH_SCHEMA = "hangwatch.attach-nodes/1"


class CollectMode(StrEnum):
    CENSUS = "census"  # processes, ranks, CPU and thread states over a short window: cheap, for watch loops
    FULL = "full"  # census plus k stack samples per rank and log tails: for diagnosis


@dataclass(frozen=True)
class NodeIdentity:
    """Which machine (and which PID namespace) answered: pids mean something only together with these."""

    hostname: str
    boot_id: str  # /proc/sys/kernel/random/boot_id: tells a rebooted node, or two containers of one host
    pid_ns: int  # inode of /proc/self/ns/pid: two pid namespaces on one host give different inodes
    kernel: str
    # Whether the collector holds CAP_SYS_PTRACE (CapEff bit 19): what py-spy needs for another
    # process whose capabilities exceed its own; a Kubernetes container lacks it unless it is added.
    sys_ptrace: bool | None = None


@dataclass(frozen=True)
class ClockReading:
    """The node's clocks when the collector started, and how long it ran: the controller bounds the skew
    from these and its own send and receive times."""

    wall_s: float  # time.time() at start
    monotonic_s: float
    duration_s: float  # collector start to the bundle being written
    # How long the collector's process had run when it read wall_s (its interpreter's start, imports):
    # the reading came at least this long after the transport delivered the command.
    since_exec_s: float = 0.0


@dataclass(frozen=True)
class ThreadState:
    """One thread over the collection window (/proc/PID/task/TID/stat)."""

    tid: int
    name: str
    state: ProcState  # at the end of the window
    cpu_delta_s: float  # CPU seconds used during the window


@dataclass(frozen=True)
class NodeProcess:
    """One process of the server on this node, with the rank and where the rank came from."""

    pid: int
    ppid: int
    name: str
    role: str | None
    rank: str | None
    # "title" (the engine's process title: sglang::scheduler_TP3), "env:RANK", "env:SLURM_PROCID", ...
    rank_source: str | None
    world_size: int | None
    env: dict[str, str]  # allow-listed keys only (ENV_KEYS in nodes/collector.py), values redacted
    cpu_cores: float  # CPU used over the window, in cores
    threads: tuple[ThreadState, ...] = ()
    threads_omitted: int = 0  # threads beyond the per-process cap


@dataclass(frozen=True)
class LogTail:
    source: str  # the file, or "/proc/PID/fd/2 -> FILE"
    lines: tuple[str, ...]  # redacted
    # Followed (a stream's census): the bytes the log grew by since the previous request, and the lines
    # beyond the per-round cap that were counted but not sent.
    new_bytes: int = 0
    lines_omitted: int = 0


@dataclass(frozen=True)
class BundleError:
    """Something the collector could not do, said where it happened: evidence, never a crash."""

    stage: str  # "select", "stacks", "procfs", "log", "limits"
    detail: str
    pid: int | None = None


@dataclass(frozen=True)
class NodeProbe:
    """The engine's readiness URL probed on the node itself (servers listen on the node's loopback)."""

    probe: ProbeResult
    node_rank: int | None  # the engine's --node-rank, where its command line gives one
    # Why this answer says nothing of readiness or progress (SGLang's dummy health server on node
    # ranks >= 1); None for a real server's answer.
    dummy: str | None = None


@dataclass(frozen=True)
class NodeBundle:
    schema: str
    collector_version: str
    mode: CollectMode
    selector: str  # what the caller asked for: "pid 812", "match 'sglang::'"
    node: NodeIdentity
    clock: ClockReading
    processes: tuple[NodeProcess, ...]
    ticks: tuple[Tick, ...]  # one per round (census: start and end of the window), ``t`` from collector start
    stacks: tuple[StackSample, ...] = ()  # full mode: k rounds over every process
    logs: tuple[LogTail, ...] = ()
    errors: tuple[BundleError, ...] = ()
    truncated: bool = False  # parts were dropped to stay under the size limit (``errors`` says which)
    gpu: GpuSample | None = None  # NVML on the node at the end of the window (pids are as NVML gives them)
    probes: tuple[NodeProbe, ...] = ()
    # A stream's census: what each log said since the previous request (the watch follows logs on every
    # node as it does on one: phases, exceptions, new lines as progress).
    follow: tuple[LogTail, ...] = ()


class NodeOutcome(StrEnum):
    """What a transport made of one node."""

    OK = "ok"
    REFUSED = "refused"  # nothing listens (sshd down)
    AUTH = "auth"  # the node refused our credentials (a wrong key, no agent)
    HOST_KEY = "host-key"  # the node's host key is unknown or changed
    UNREACHABLE = "unreachable"  # name does not resolve, no route
    TIMEOUT = "timeout"  # no answer within the per-node timeout (connect or collect)
    NO_COLLECTOR = "no-collector"  # hangwatch is not found on the node
    REMOTE_ERROR = "remote-error"  # the collector ran and failed
    BAD_OUTPUT = "bad-output"  # the answer is not a bundle (not JSON, another schema, too large)


@dataclass(frozen=True)
class NodeAnswer:
    """What a transport got from one node: the collector's output (``OK``, not decoded yet), or why none."""

    host: str
    outcome: NodeOutcome
    detail: str
    stdout: bytes
    sent_wall_s: float
    received_wall_s: float


@dataclass(frozen=True)
class PodTarget:
    """A pod that ``kubectl get pods -l SELECTOR`` named, as the kubectl transport reaches it."""

    name: str
    namespace: str
    node_name: str  # spec.nodeName: the machine it runs on
    phase: str  # status.phase: Running, Pending, ...
    container: str  # the one the collector runs in (--kube-container, else the first)
    containers: tuple[str, ...]
    role: str  # "lws group 0 leader", "lws group 0 worker 1", "ray head", "ray worker (workergroup)", ""
    # securityContext.capabilities.add holds SYS_PTRACE (stacks need it; a container lacks it by default).
    ptrace_added: bool
    labels: dict[str, str]


@dataclass(frozen=True)
class NodeResult:
    """One node as the transport saw it: the bundle, or why there is none, with the controller's times."""

    host: str  # as the user named it (``node7``, an address, an ssh_config alias)
    outcome: NodeOutcome
    detail: str
    bundle: NodeBundle | None
    sent_wall_s: float  # controller clock when the remote command was started
    received_wall_s: float  # ... when its output was complete
    output_bytes: int = 0


@dataclass(frozen=True)
class ClockSkew:
    """Node clock minus controller clock, within ``± bound_s`` (half the time the exchange left unknown)."""

    offset_s: float
    bound_s: float


@dataclass(frozen=True)
class NodeSummary:
    label: str  # how the report names the node: its hostname, or the host as given when hostnames repeat
    host: str
    outcome: NodeOutcome
    detail: str
    pid_ns: int | None
    processes: int
    ranks: tuple[str, ...]
    rank_label: str  # the ranks as compact ranges: "rank0-1", "TP8-15"
    skew: ClockSkew | None
    elapsed_s: float  # send to receive, on the controller
    collect_s: float | None  # the collector's own run time
    errors: tuple[BundleError, ...] = ()
    gpus: str = ""  # "2 GPUs: util 97-100 %, 71.2 GiB used", or why none was read
    probe: str = ""  # "http://127.0.0.1:30000/health: HTTP 200", with why it does not count where it does not


@dataclass(frozen=True)
class RankPlace:
    """Where one rank of the job was found: keyed by (node, pid namespace, pid); pids repeat across nodes."""

    rank: int
    node: str
    pid_ns: int
    pid: int
    key: int  # the process's key in the merged samples
    where: str  # its main thread's wait, "" when its stack was not read


@dataclass(frozen=True)
class RankCensus:
    """Which ranks of the world checked in, on which node, and who is missing."""

    world_size: int | None
    found: tuple[RankPlace, ...]
    missing: tuple[int, ...]
    duplicated: tuple[int, ...]  # a rank found twice (two jobs matched, or a stale process)
    silent_nodes: tuple[str, ...]  # nodes that did not answer: a missing rank may be there
    by_node: tuple[tuple[str, str], ...] = ()  # (node, its ranks as compact ranges), in rank order
    missing_label: str = ""  # compact ranges: "rank2-3"
    duplicated_label: str = ""


@dataclass(frozen=True)
class ProcessKey:
    """Where a process of the merge really is: pids mean something only with their node and namespace."""

    node: str
    pid_ns: int
    pid: int


@dataclass(frozen=True)
class NodesDiagnosis:
    """The cause the one-node rules named over every node's ranks; culprits are merge keys."""

    cause: Cause
    confidence: Confidence | None
    explanation: str
    culprits: tuple[int, ...]
    # The rules that decided it (rulebook ids), and for ``unknown`` the closest ones, as a run's verdict.
    decided_by: tuple[str, ...] = ()
    near_misses: tuple[NearMiss, ...] = ()


@dataclass(frozen=True)
class NodesReport:
    """``hangwatch stacks --hosts``: what the text shows, and the JSON (schema hangwatch.stacks-nodes/1)."""

    schema: str
    selector: str
    nodes: tuple[NodeSummary, ...]
    ranks: RankCensus
    processes: dict[int, ProcessKey]  # merge key -> where the process is
    diagnosis: NodesDiagnosis
    next_steps: tuple[str, ...]
    stack_tree: StackTree
    # How the transport took the evidence where that matters to the reader (Ray: the dashboard's
    # traceback endpoint, or ssh because the endpoint answered 403).
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeWatchSummary:
    """One node over a watch: how many census rounds it answered, and when it fell silent (evidence)."""

    label: str
    host: str
    pid_ns: int | None
    rounds_answered: int
    rounds_failed: int
    last_outcome: NodeOutcome
    last_detail: str
    silent_since_s: float | None  # still silent at the end, since this watch time
    processes: int  # as last seen
    events: tuple[str, ...] = ()  # "hwnode2 stopped answering at 12.3 s (refused): ..."


@dataclass(frozen=True)
class RoundCost:
    """What the census rounds cost the controller (wall seconds per round, all nodes in parallel)."""

    rounds: int
    median_s: float
    max_s: float
    stack_rounds: int
    stack_median_s: float


@dataclass(frozen=True)
class NodesWatchReport:
    """``hangwatch attach --hosts``: one verdict for the job (schema hangwatch.attach-nodes/1)."""

    schema: str
    selector: str
    verdict: Verdict
    duration_s: float
    nodes: tuple[NodeWatchSummary, ...]
    processes: dict[int, ProcessKey]  # merge key -> where the process is (the verdict's culprits)
    cost: RoundCost
    stack_tree: StackTree | None = None
    log_tail: tuple[str, ...] = ()  # the nodes' last log lines, each with its node ("hwnode3: ..."), redacted
    # What the reader needs to know of how the nodes were read: a name left out as another name of a
    # machine already watched ("h2 is the same machine as h1 (same boot id and pid namespace): ...").
    notes: tuple[str, ...] = ()
