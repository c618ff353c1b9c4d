"""The verdict and the report: what every renderer and the JSON contract are built from."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field

from hangwatch.model.flightrecorder import FlightCapture
from hangwatch.model.gpukernels import KernelSample
from hangwatch.model.history import HistoryComparison
from hangwatch.model.history import PhaseWindow
from hangwatch.model.ncclras import RasSnapshot
from hangwatch.model.rulebook import NearMiss
from hangwatch.model.samples import ProbeResult
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import StackTree
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import Confidence
from hangwatch.model.vocabulary import State

REPORT_SCHEMA = "hangwatch.report/1"


@dataclass(frozen=True)
class Verdict:
    state: State
    cause: Cause | None
    phase: str | None  # "cuda_graph (capturing CUDA graphs; after 'Load weight end...')"
    summary: str
    culprits: tuple[int, ...]
    evidence: tuple[str, ...]
    next_steps: tuple[str, ...] = ()
    confidence: Confidence | None = None  # when stacks named the cause
    # The rules that decided it, in order: the state's, then the cause's and culprit's, then refinements
    # (ids of the rulebook, analyse/rulebook.py; docs/verdicts.md says what each requires).
    decided_by: tuple[str, ...] = ()
    # Where no rule named a cause or a culprit: the rules that came closest, and what each lacked.
    near_misses: tuple[NearMiss, ...] = ()

    @property
    def exit_code(self) -> int:
        return self.state.exit_code

    @property
    def phase_name(self) -> str | None:
        """The phase without its words: "cuda_graph" of "cuda_graph (capturing CUDA graphs; ...)"."""
        return self.phase.split(" (", 1)[0] if self.phase else None

    @property
    def headline(self) -> str:
        """ "state: summary", without saying the state twice when the summary already starts with it."""
        prefix = f"{self.state.value}:"
        return self.summary if self.summary.startswith(prefix) else f"{prefix} {self.summary}"


@dataclass(frozen=True)
class PhaseSpan:
    name: str
    start: float
    end: float | None  # None while the phase is still current
    label: str = ""
    line: str = ""  # the log line that opened it
    # Its longest quiet spell (seconds with no progress signal) before ready: what --stall-after auto's
    # windows are drawn from in later boots; None where it was not watched (serving, a report's load).
    quiet_s: float | None = None


@dataclass(frozen=True)
class ProcessRecord:
    """A process seen at any time during supervision, as last seen."""

    pid: int
    ppid: int
    name: str
    cmdline: tuple[str, ...]
    role: str | None
    rank: str | None
    state: str  # last /proc state letter, or "gone"
    exit_code: int | None  # shell convention for signals: -N for a death by signal N
    exit_how: str | None = None
    first_seen: float = 0.0
    last_seen: float = 0.0
    # Its /proc state at the verdict, before hangwatch's own clean-up ("gone" when it had ended by then);
    # None where the report has no clean-up (attach) or it was first seen during the clean-up.
    verdict_state: str | None = None
    cleanup: str | None = None  # what the clean-up did to it: "SIGTERM: -15", "SIGKILL: -9", "REMAINS"


@dataclass(frozen=True)
class Report:
    schema: str
    engine: str
    mode: str  # "run" or "attach"
    command: tuple[str, ...]
    started_at: str  # wall clock, ISO 8601, for the person reading it later
    duration_s: float
    log_path: str | None
    verdict: Verdict
    phases: tuple[PhaseSpan, ...]
    processes: tuple[ProcessRecord, ...]
    probes: tuple[ProbeResult, ...]
    timeline: tuple[Tick, ...]
    notes: tuple[str, ...] = ()  # degraded signals: "GPU: unavailable: no NVML library", ...
    stacks: tuple[StackSample, ...] = ()  # capture rounds, per process and thread (empty while healthy)
    stack_tree: StackTree | None = None  # the latest round merged across ranks
    # Versions a bug template asks for ("Python", "torch", "torch CUDA", "vllm", "NVIDIA driver", ...),
    # in reading order; empty where none could be read (collect/versions.py).
    environment: dict[str, str] = field(default_factory=dict)
    last_progress_t: float | None = None  # when the tree last progressed, as the verdict saw it
    stall_after_s: float | None = None  # the stall rule (--stall-after), for the timeline's stall window
    log_tail: tuple[str, ...] = ()  # the log's last lines at the end, redacted (collect/logtail.tail_lines)
    # What hangwatch did to the tree it launched, in words ("stopped at the verdict: 3 processes ...",
    # "left running (--keep-running)"); None in attach, which never touches it.
    tree_action: str | None = None
    # This boot's phases against the earlier boots of its configuration (supervise/history.py, read before
    # this one was recorded); None where history is off (the notes say why) or not kept (attach, the demo).
    phase_history: HistoryComparison | None = None
    # --stall-after auto: each boot phase's own stall window and what it was drawn from (model.history
    # AUTO_RULE); empty with a fixed window, or where no phase had enough boots yet (the notes say so).
    stall_windows: tuple[PhaseWindow, ...] = ()
    # The running kernels of the tree's GPU processes, read by cuda-gdb at a gpu-spin verdict
    # (supervise/watch.Watch.name_kernels); None where they were not read.
    kernels: KernelSample | None = None
    # The ranks' Flight Recorder dumps read at a stall (each group's last enqueued, started and completed
    # collective per rank), where the tree's ranks had the recorder on.
    flight_recorder: FlightCapture | None = None
    # NCCL RAS's two readings at a stall, where a member of the tree served it.
    nccl_ras: tuple[RasSnapshot, ...] = ()
