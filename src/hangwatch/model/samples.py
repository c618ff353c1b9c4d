"""One frozen sample per signal source, and the tick that bundles them.

Every sample carries ``t``: seconds since supervision started, from a monotonic clock.
Collector failures are part of the sample (``ProcessSample.io_error``, ``GpuSample.error``, a probe's
outcome), never exceptions that stop the loop: a process whose /proc/PID/io cannot be read is itself
evidence. A tick taken late says so (``Tick.late_s``), as py-spy's samples do.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from enum import StrEnum
from typing import NamedTuple

from hangwatch.model.vocabulary import Cause


class ProcState(StrEnum):
    """A process's state from /proc/PID/stat, named as psutil names them (proc(5)). The value is the
    kernel's letter, so reports keep printing "S", "D", "T"."""

    RUNNING = "R"
    SLEEPING = "S"
    DISK_SLEEP = "D"  # uninterruptible: I/O, a driver
    STOPPED = "T"  # job control (SIGSTOP, SIGTSTP)
    TRACING_STOP = "t"  # stopped by a tracer
    ZOMBIE = "Z"
    DEAD = "X"
    IDLE = "I"  # a kernel thread idle (an interruptible sleep that does not count to the load)
    PARKED = "P"
    WAKE_KILL = "K"
    WAKING = "W"
    UNKNOWN = "?"  # a letter this table does not know

    @classmethod
    def _missing_(cls, value: object) -> ProcState:
        return cls.DEAD if value == "x" else cls.UNKNOWN  # "x": dead, on kernels 2.6.33 to 3.13


# States in which a process does not run until someone continues it (SIGCONT, the tracer).
STOPPED_STATES = frozenset({ProcState.STOPPED, ProcState.TRACING_STOP})
# Ended: nothing of it runs; a zombie waits to be reaped.
ENDED_STATES = frozenset({ProcState.ZOMBIE, ProcState.DEAD})


class ProcessId(NamedTuple):
    """Who a process is across pid reuse: its pid and its start time in clock ticks since boot
    (/proc/PID/stat field 22). Only a process with both is ever signalled."""

    pid: int
    start_ticks: int


@dataclass(frozen=True)
class ProcessSample:
    """One process of the tree at one tick (/proc/PID/{stat,io,cmdline,comm,fd})."""

    pid: int
    ppid: int
    name: str  # the process title where one was set (``VLLM::Worker_TP1``), else comm
    cmdline: tuple[str, ...]  # secrets already redacted
    state: ProcState
    cpu_s: float  # user + system CPU seconds since the process started
    cpu_delta_s: float  # since the previous tick (0.0 at first sight)
    rchar: int | None  # None when /proc/PID/io is unreadable (see ``io_error``)
    wchar: int | None
    io_delta_bytes: int  # rchar + wchar since the previous tick; counts page-cache and pipe traffic
    threads: int
    rss_bytes: int
    listening_ports: tuple[int, ...]
    role: str | None
    rank: str | None
    io_error: str | None = None
    # Page faults (minor + major) since the process started: fresh memory touched, the mark of work that
    # allocates or copies (None where not read, as in samples from another node's older collector).
    faults: int | None = None


class ExitHow(StrEnum):
    """How hangwatch learned that a process ended (and how much it could know)."""

    WAITPID = "waitpid"  # our own child (or an orphan we adopted as subreaper): exact status
    ZOMBIE_STAT = "zombie-stat"  # read from the exit-code field of /proc/PID/stat before reaping
    VANISHED = "vanished"  # gone before anything could be read: status unknown


@dataclass(frozen=True)
class ExitRecord:
    """A process of the tree that ended."""

    t: float
    pid: int
    name: str
    role: str | None
    rank: str | None
    how: ExitHow
    exit_code: int | None = None  # for a normal exit
    signal: int | None = None  # for a death by signal
    lifetime_s: float | None = None
    oom_evidence: str | None = None  # kernel or cgroup lines that name this death an OOM kill
    # Its wchar when it ended (every byte it wrote: log, pipes, files), read from its zombie; None unknown.
    wchar_at_end: int | None = None
    # It never set a title of its own (its name is its comm when first seen): the title its log lines give
    # it names it (analyse/logscan.named_exits).
    untitled: bool = False

    @property
    def failed(self) -> bool:
        return self.signal is not None or (self.exit_code is not None and self.exit_code != 0)

    @property
    def status_text(self) -> str:
        if self.signal is not None:
            return f"killed by signal {self.signal} ({_signal_name(self.signal)})"
        if self.exit_code is not None:
            return f"exit code {self.exit_code}"
        return "vanished (exit status unknown)"


def _signal_name(signum: int) -> str:
    import signal as _signal

    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


@dataclass(frozen=True)
class PhaseEvent:
    """A log line that marks the start of a phase of the engine's startup."""

    t: float
    phase: str
    line: str
    # Who printed it, where the line says so: "pid:812" (vLLM's prefix) or "rank:TP1" (SGLang's).
    source: str | None = None


@dataclass(frozen=True)
class LogFinding:
    """A log line that names a cause (a traceback, a CUDA OOM, a port in use)."""

    t: float
    cause: Cause
    line: str
    # Who wrote it, where the line says so: vLLM's ``(EngineCore pid=812)``, SGLang's ``TP1``.
    pid: int | None = None
    rank: str | None = None

    @property
    def opens_traceback(self) -> bool:
        """Python's ``Traceback (most recent call last):`` header, after any writer's prefix: the line
        that starts a traceback, not the one that says what was raised."""
        return self.line.rstrip().endswith("Traceback (most recent call last):")


@dataclass(frozen=True)
class LogSample:
    """What the log said since the previous tick."""

    new_bytes: int = 0
    new_lines: int = 0
    # Lines the engine prints while it waits (vLLM's "No available shared memory broadcast block
    # found in 60 seconds"): output, but not progress.
    waiting_lines: int = 0
    # Lines our own probes caused (an access log line for GET /health, a "connection from" line
    # naming our probe's port): the server answering us is not the server making progress.
    echo_lines: int = 0
    # Lines that arrived right after a probe was sent, judged once that probe's outcome is known
    # (analyse/echoes.py): not progress yet; the ones that turn out the server's own count later, as
    # ``released_lines`` of the tick that judged them.
    held_lines: int = 0
    released_lines: int = 0
    undecided_lines: int = 0  # held lines still waiting for their probe's outcome after this tick
    # Lines that say again what their writer said before with other counts (a retry loop's "attempt
    # 7, waited 14 s", a training loop's "step 12"): weak evidence, like CPU time, which the stacks can
    # discount when the writer's code stays in place. Their bytes, and the writers the lines name.
    heartbeat_lines: int = 0
    heartbeat_bytes: int = 0
    heartbeat_pids: tuple[int, ...] = ()
    phase_events: tuple[PhaseEvent, ...] = ()
    findings: tuple[LogFinding, ...] = ()
    ready_line: str | None = None
    last_line: str | None = None
    # Processes the lines name by pid (vLLM's "(Worker_TP1 pid=812)"): pid -> the label they give.
    named: tuple[tuple[int, str], ...] = ()
    tail: tuple[str, ...] = ()  # the last few lines (redacted): a crash with no traceback is quoted

    @property
    def progress_lines(self) -> int:
        return (
            self.new_lines
            - self.waiting_lines
            - self.echo_lines
            - self.held_lines
            - self.heartbeat_lines
            + self.released_lines
        )


class ProbeOutcome(StrEnum):
    REFUSED = "refused"
    TIMEOUT = "timeout"
    HTTP = "http"
    ERROR = "error"


# An HTTP answer that says yes: readiness by --ready-url, and a probe green while serving.
SUCCESS_STATUSES = frozenset(range(200, 300))


@dataclass(frozen=True)
class ProbeResult:
    """One HTTP readiness probe and exactly what happened to it."""

    t: float
    url: str  # redacted
    outcome: ProbeOutcome
    status: int | None = None
    detail: str | None = None
    elapsed_s: float = 0.0

    @property
    def key(self) -> tuple[str, int | None]:
        """What a change of outcome is judged on (the detail text may vary between probes)."""
        return (self.outcome.value, self.status)

    @property
    def green(self) -> bool:
        """An HTTP answer with a 2xx status (whatever the engine's own readiness statuses are)."""
        return self.outcome is ProbeOutcome.HTTP and self.status in SUCCESS_STATUSES

    def describe(self) -> str:
        if self.outcome is ProbeOutcome.HTTP:
            return f"HTTP {self.status}"
        if self.detail:
            return f"{self.outcome.value} ({self.detail})"
        return self.outcome.value


@dataclass(frozen=True)
class GpuReading:
    """One GPU as NVML sees it. Fields NVML does not support on this GPU are None."""

    index: int
    name: str
    util_pct: float | None
    mem_util_pct: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    power_w: float | None
    sm_clock_mhz: int | None
    uuid: str | None = None  # "GPU-5f1c...": how dcgm-exporter and the sidecar's metrics label it


@dataclass(frozen=True)
class GpuProcessMemory:
    pid: int
    gpu_index: int
    used_bytes: int | None
    # The share of time its kernels ran on the GPU's SMs since the last reading (NVML's per-process
    # samples); None where the GPU or driver does not give it. It tells, on a spinning GPU, whose kernel
    # spins: the rank that never launched its half of a collective reads 0.
    sm_util_pct: float | None = None


def _peak(*pipes: float | None) -> float | None:
    """The busiest of the pipes this GPU reported (None: it reported none of them)."""
    known = [p for p in pipes if p is not None]
    return max(known) if known else None


@dataclass(frozen=True)
class GpuActivity:
    """NVML GPM metrics of one GPU between two readings (Hopper and newer), percentages: between two stack
    captures, or two ticks while the tree holds a GPU context (``GpuSample.activity``)."""

    index: int
    interval_s: float
    graphics_util: float | None
    sm_util: float | None
    tensor_util: float | None
    dram_bw_util: float | None
    integer_util: float | None
    fp32_util: float | None
    fp16_util: float | None

    def pipes_idle(self, limit: float = 5.0) -> bool:
        """Tensor, DRAM and arithmetic pipes all near 0: nothing is being computed or moved."""
        peak = _peak(self.tensor_util, self.dram_bw_util, self.integer_util, self.fp32_util, self.fp16_util)
        return peak is not None and peak < limit

    def computing(self, limit: float = 5.0) -> bool:
        """An arithmetic pipe (tensor, FP32, FP16, integer) well above what a spin lifts (every SM spinning:
        integer 0.65 %, the rest 0): work whatever NVML's memory utilisation says (a GEMM whose operands
        sit in L2). DRAM is left to NVML's memory utilisation and its own threshold: a kernel polling
        memory for a peer's flag reads some, and is no work."""
        peak = _peak(self.tensor_util, self.integer_util, self.fp32_util, self.fp16_util)
        return peak is not None and peak >= limit

    def describe(self) -> str:
        """``tensor 41 %, DRAM 2 %, FP32 0 %``: the pipes it read."""
        named = (
            ("tensor", self.tensor_util), ("DRAM", self.dram_bw_util), ("FP32", self.fp32_util),
            ("FP16", self.fp16_util), ("integer", self.integer_util),
        )  # fmt: skip
        return ", ".join(f"{name} {value:.0f} %" for name, value in named if value is not None)


@dataclass(frozen=True)
class GpuSample:
    """All GPUs at one tick, or why none could be read."""

    unavailable: str | None = None  # the reason, when NVML or a GPU is missing
    gpus: tuple[GpuReading, ...] = ()
    processes: tuple[GpuProcessMemory, ...] = ()
    error: str | None = None  # a read failed this tick (evidence: a wedged driver can do this)
    # GPM's pipes since the previous tick, per GPU, read only on GPUs with GPM (Hopper and newer) that the
    # tree holds and NVML cannot judge (kernels running, little memory moved: gpustate.ambiguous): what
    # tells compute whose operands stay in cache from a spin.
    activity: tuple[GpuActivity, ...] = ()

    def memory_of(self, pids: frozenset[int]) -> int:
        return sum(p.used_bytes or 0 for p in self.processes if p.pid in pids)


@dataclass(frozen=True)
class ServingSample:
    """The server-side view while serving, from its Prometheus /metrics (failure mode F6: every probe
    stays green while requests queue and no token is produced)."""

    t: float
    running: float | None = None
    waiting: float | None = None
    generated_tokens: float | None = None  # the engine's generation-token counter
    error: str | None = None  # the scrape failed: why

    @property
    def busy(self) -> bool:
        return (self.running or 0) + (self.waiting or 0) > 0


@dataclass(frozen=True)
class ServerConnection:
    """One accepted client connection on a listening port of the tree, from the kernel's TCP state."""

    port: int  # the server's listening port
    peer_port: int
    received_bytes: int | None  # what the client sent (requests)
    acked_bytes: int | None  # what the server sent that the client acknowledged (answers, tokens)
    # The client's last data came after the server's last: a request waiting for its answer, this long.
    unanswered_s: float | None
    ours: bool = False  # hangwatch's own probe or request
    # The client end is a process of the watched tree (vLLM's and SGLang's processes talk to each other
    # over TCP on ports of the tree): traffic inside the server, not a request from a client.
    internal: bool = False
    # Bytes the client sent sit unread in the server's receive queue (or the connection waits in the
    # listening socket's queue, never accepted), for at least this long: the server is not reading.
    unread_s: float | None = None


@dataclass(frozen=True)
class ConnectionSample:
    """The server's client connections at one tick (failure mode F6 seen from outside the engine)."""

    ports: tuple[int, ...]
    connections: tuple[ServerConnection, ...] = ()
    error: str | None = None

    @property
    def theirs(self) -> tuple[ServerConnection, ...]:
        """The clients' connections: neither hangwatch's own nor the tree's among its processes."""
        return tuple(c for c in self.connections if not c.ours and not c.internal)

    @property
    def unanswered(self) -> tuple[ServerConnection, ...]:
        return tuple(c for c in self.theirs if c.unanswered_s is not None)


@dataclass(frozen=True)
class OwnRequest:
    """hangwatch's own one-token completion while serving: pending, or how it ended."""

    sent_t: float
    url: str
    done_t: float | None = None  # None while pending
    answered: bool = False  # a complete HTTP 2xx answer came
    detail: str = ""  # "HTTP 200 in 0.04 s", "no answer within 65 s", "HTTP 503"

    def pending_for(self, now: float) -> float | None:
        return now - self.sent_t if self.done_t is None else None


@dataclass(frozen=True)
class ProbeMarks:
    """What hangwatch's own probes leave in the server's log, read from the prober at the tick: the text
    by which an access-log line names our probe (its path, our source ports), when the recent probes were
    sent (the one in flight included), and the answers that came after their probe had timed out. The
    analysis tells the server answering us from the server making progress with them (analyse/echoes.py)."""

    echo_markers: tuple[str, ...] = ()
    sends: tuple[float, ...] = ()
    late_answers: tuple[ProbeResult, ...] = ()


@dataclass(frozen=True)
class LogLines:
    """A log's news since the last tick, as read: the lines completed, the bytes that arrived, and when
    each line arrived on the watch's clock (empty where only the drain time is known); with what the
    probes answered there left in it (``marks``).

    One node's watch reads one log; across nodes each node's logs come as one ``LogLines``, its ``source``
    the node's index and ``label`` its name, with the lines its collector counted but left out."""

    lines: tuple[str, ...] = ()
    new_bytes: int = 0
    times: tuple[float, ...] = ()
    marks: ProbeMarks = field(default_factory=ProbeMarks)
    source: int = 0
    label: str = ""
    omitted: int = 0


@dataclass(frozen=True)
class Tick:
    """Everything collected at one moment.

    The watch loops collect ``logs`` raw (one per log source); the analysis reads them into ``log``
    (Assessor.observe). A tick whose log was read already (a test's fixture) comes with ``log`` and no
    ``logs``."""

    t: float
    processes: tuple[ProcessSample, ...]
    exits: tuple[ExitRecord, ...] = ()
    log: LogSample = field(default_factory=LogSample)
    logs: tuple[LogLines, ...] = ()
    probes: tuple[ProbeResult, ...] = ()
    gpu: GpuSample | None = None
    serving: ServingSample | None = None
    connections: ConnectionSample | None = None
    own_request: OwnRequest | None = None  # the latest one, pending or done
    # How far behind its schedule this tick was taken (a slow /proc, NVML or stack capture held the loop):
    # the report says so when a tick came a whole interval late (Watch.report).
    late_s: float = 0.0

    def process(self, pid: int) -> ProcessSample | None:
        for p in self.processes:
            if p.pid == pid:
                return p
        return None
