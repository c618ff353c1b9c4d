"""What an engine profile knows, as data: phase lines, "still waiting" lines, readiness, names."""

from __future__ import annotations

import re
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import Protocol

from hangwatch.engines.bootflags import BootFlags
from hangwatch.model.bench import SpecStats
from hangwatch.model.doctor import CacheFolder
from hangwatch.model.isolate import Edit
from hangwatch.model.isolate import EditKind
from hangwatch.model.isolate import Toggle
from hangwatch.model.metrics import MetricNames
from hangwatch.model.metrics import MetricsSnapshot
from hangwatch.model.vocabulary import Cause


@dataclass(frozen=True)
class PhaseRule:
    """A startup phase and the log lines that open it (current and legacy spellings)."""

    name: str
    label: str  # what a person calls it: "loading weights"
    patterns: tuple[re.Pattern[str], ...]
    # The name to use when the phase opens a second time (SGLang's draft model loads with the
    # same "Load weight begin." line as the target).
    again: str | None = None


def rule(name: str, label: str, *patterns: str, again: str | None = None) -> PhaseRule:
    return PhaseRule(name, label, tuple(re.compile(p) for p in patterns), again)


RoleOf = Callable[[str, tuple[str, ...], bool, dict[str, str]], tuple[str | None, str | None]]


def title_roles(title_pattern: re.Pattern[str], root_role: str) -> RoleOf:
    """The role function of an engine that titles its processes: the title's ``role`` and ``rank`` groups;
    the launched command (untitled) is ``root_role``; anything else untitled has no role."""

    def role_of(
        title: str, cmdline: tuple[str, ...], is_root: bool, env: dict[str, str]
    ) -> tuple[str | None, str | None]:
        m = title_pattern.match(title)
        if m:
            return m.group("role"), m.group("rank")
        if is_root:
            return root_role, None
        return None, None

    return role_of


# The built-in changes ``hangwatch isolate`` tries: (command line, the engine's installed version or None)
# -> the toggles that apply to that command (docs/isolate.md).
TogglesOf = Callable[[tuple[str, ...], str | None], tuple[Toggle, ...]]


def _no_toggles(argv: tuple[str, ...], version: str | None) -> tuple[Toggle, ...]:
    return ()


# /metrics read before and after each round of a benchmark, oldest first.
SnapshotPairs = Sequence[tuple[MetricsSnapshot, MetricsSnapshot]]


@dataclass(frozen=True)
class SpecMetrics:
    """How an engine's /metrics tell speculative decoding's acceptance (``hangwatch bench``)."""

    stats: Callable[[SnapshotPairs], SpecStats | None]  # None: the server exposes none
    names: str  # what a reader looks for on /metrics: "vllm:spec_decode_*"
    counters: tuple[str, ...]  # the counters a run moves: a scrape is settled when two in a row agree
    absent: str | None = None  # the note where none are exposed, when it says more than the common one
    caveat: str | None = None  # the note that goes with its figures, always


class EnvSetting(Protocol):
    """What an engine's environment rule reads (doctor's NCCL check gives it)."""

    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def cmd(self) -> str: ...
    @property
    def multi(self) -> bool: ...
    @property
    def pcie_only(self) -> Sequence[object]: ...
    def version(self, *distributions: str) -> tuple[int, ...] | None: ...


@dataclass(frozen=True)
class EnvRule:
    """An engine's own reading of a setting (doctor's NCCL and engine-environment check)."""

    name: str
    applies: Callable[[EnvSetting], bool]
    message: Callable[[EnvSetting], str]
    severity: str = "warn"  # "warn": known to hang or to look hung; "note": what the engine does with it
    # The common rule (or an earlier engine rule) it is listed after: the first warning is the summary.
    after: str = ""


# NodeProbe's dummy: why this node's readiness answer says nothing (argv, /health status, the status of
# ``dummy_probe_path``), or None when it is the real server.
DummyHealth = Callable[[Sequence[str], int | None, int | None], str | None]

# Purposes of ``Profile.next_step_flags``: what a next step asks the engine to turn off.
CUDA_GRAPHS_OFF = "cuda-graphs-off"  # CUDA graph capture only
EAGER = "eager"  # CUDA graphs and compilation both
COMPILE_OFF = "compile-off"  # a flag that boots without torch.compile
COMPILE_ON = "compile-on"  # the flag that turns torch.compile on: drop it to boot without
CUSTOM_ALL_REDUCE_PCIE_OFF = "custom-all-reduce-pcie-off"  # the environment that keeps it off PCIe


@dataclass(frozen=True)
class Profile:
    name: str
    phases: tuple[PhaseRule, ...]
    role_of: RoleOf
    display_name: str = ""  # how people write it ("vLLM"); the name where empty
    command_markers: tuple[re.Pattern[str], ...] = ()
    # Output that means "I am still waiting", printed on a timer: not progress (docs/engine-facts.md).
    waiting_patterns: tuple[re.Pattern[str], ...] = ()
    ready_patterns: tuple[re.Pattern[str], ...] = ()  # a log line that by itself means ready
    health_path: str | None = None
    ready_statuses: frozenset[int] = frozenset({200})
    default_port: int | None = None
    extra_phase_labels: dict[str, str] = field(default_factory=dict)
    # Which process of the tree logged a line (SGLang's "[time TP1]" tag): a phase "opened again" (the
    # draft model, PhaseRule.again) is a second pass of the same source, not another rank's first one.
    # Its "source" group names it; lines it does not match share one source.
    line_source: re.Pattern[str] | None = None
    # The title a process has, from the label its log lines give it ("Worker_TP1" -> "VLLM::Worker_TP1"):
    # before an engine sets its titles (vLLM's CPU build: for a minute or more), the log says who is who.
    title_prefix: str = ""
    toggles: TogglesOf = _no_toggles
    distribution: str | None = None  # the package whose installed version picks the toggles ("sglang")
    metrics: MetricNames | None = None  # the names of its /metrics (serving stall, bench)
    # It serves the OpenAI API: hangwatch may send it a one-token completion of its own while it serves, and
    # the access-log lines of that request's model lookup and of our /metrics scrape are echoes of ours.
    openai_api: bool = False
    # --- Facts the analysis reads through the registry (engines/registry.py), all engines' together ---
    # Who wrote a log line: regex sources of what the engine's writers put before a message (vLLM's
    # ``(Worker_TP1 pid=90) ``), and of the level, time and file header after it.
    log_prefixes: tuple[str, ...] = ()
    log_headers: tuple[str, ...] = ()
    writer_pid: re.Pattern[str] | None = None  # a line's writer: its "label" and "pid" groups
    writer_rank: re.Pattern[str] | None = None  # a line's writer's rank tag: its "rank" group
    fatal_lines: tuple[str, ...] = ()  # regex sources of lines that say the engine failed to start
    compile_frames: tuple[str, ...] = ()  # regex sources of stack frames of the engine's compilation
    kernel_namespaces: tuple[tuple[str, str], ...] = ()  # ("vllm::", "vLLM"): a GPU kernel's library
    # Native modules that only one feature loads (doctor's coverage): (feature key, regex source).
    feature_modules: tuple[tuple[str, str], ...] = ()
    # The flags (or settings) next steps name, by purpose (CUDA_GRAPHS_OFF, EAGER, ...).
    next_step_flags: Mapping[str, str] = field(default_factory=dict)
    distributions: tuple[str, ...] = ()  # its packages as pip names them, for the versions read
    cache_dirs: tuple[CacheFolder, ...] = ()  # where it caches compiled and downloaded things
    env_rules: tuple[EnvRule, ...] = ()
    spec: SpecMetrics | None = None
    boot: BootFlags = field(default_factory=BootFlags)
    # A readiness server that answers on nodes that serve nothing (SGLang's node ranks >= 1): the path
    # the real server always serves and the dummy does not, and what the two answers mean.
    dummy_probe_path: str | None = None
    dummy_health: DummyHealth | None = None

    @property
    def label(self) -> str:
        return self.display_name or self.name

    def matches(self, cmdline: list[str] | tuple[str, ...]) -> bool:
        text = " ".join(cmdline)
        return any(p.search(text) for p in self.command_markers)

    def source_of(self, line: str) -> str:
        """The line's source (``TP1``), "" when the profile cannot tell."""
        m = self.line_source.search(line) if self.line_source is not None else None
        return m.group("source") if m else ""

    def title_from_log(self, label: str) -> str:
        return label if label.startswith(self.title_prefix) else f"{self.title_prefix}{label}"

    def label_of(self, phase: str) -> str:
        for r in self.phases:
            if r.name == phase:
                return r.label
        return self.extra_phase_labels.get(phase, phase.replace("_", " "))

    def health_url(self, cmdline: list[str] | tuple[str, ...]) -> str | None:
        if self.health_path is None:
            return None
        port = flag_value(cmdline, "--port") or (str(self.default_port) if self.default_port else None)
        if port is None:
            return None
        host = flag_value(cmdline, "--host") or "127.0.0.1"
        if host in ("0.0.0.0", "::", "", "localhost"):  # noqa: S104 - a bind-all address: probe loopback
            host = "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}{self.health_path}"


def flag_value(cmdline: list[str] | tuple[str, ...], flag: str) -> str | None:
    """The value of ``--flag V`` or ``--flag=V`` (the last one wins, as in argparse)."""
    value = None
    for i, arg in enumerate(cmdline):
        if arg == flag and i + 1 < len(cmdline):
            value = cmdline[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def node_rank(argv: Sequence[str]) -> int | None:
    """``--node-rank`` (LWS passes ``$(LWS_WORKER_INDEX)``), where the command line gives it."""
    value = flag_value(list(argv), "--node-rank")
    return int(value) if value is not None and value.isdigit() else None


def has_flag(cmdline: tuple[str, ...], *flags: str) -> bool:
    """Whether any of ``flags`` is given (``--flag``, ``--flag=v``; ``--prefix-*``: any flag of it)."""
    for arg in cmdline:
        for flag in flags:
            if flag.endswith("*"):
                if arg.startswith(flag[:-1]) and len(arg) > len(flag) - 1:
                    return True
            elif arg == flag or arg.startswith(flag + "="):
                return True
    return False


def int_flag(cmdline: tuple[str, ...], *flags: str, default: int = 1) -> int:
    """The integer value of the last of ``flags`` given (``--tp 2``); ``default`` when absent or not one."""
    value = None
    for flag in flags:
        got = flag_value(cmdline, flag)
        if got is not None:
            value = got
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """``0.5.23.post1`` -> (0, 5, 23); None when it does not start with a number."""
    if not version:
        return None
    parts: list[int] = []
    for piece in version.split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) < len(piece):
            break
    return tuple(parts) or None


# Isolation toggles for a tensor-parallel command, the same for every engine: the ranks waiting on each
# other (a collective, a rendezvous, a dead peer, a GPU spinning on a flag) suggest them first.
RANKS_WAIT = (Cause.COLLECTIVE_WAIT, Cause.RENDEZVOUS_WAIT, Cause.DEAD_PEER, Cause.GPU_SPIN)


def parallel_toggles(argv: tuple[str, ...], tp_flags: tuple[str, ...], *, cumem: bool) -> list[Toggle]:
    """Custom all-reduce off, NCCL P2P off, (``cumem``: NCCL's cuMem allocations off), TP 1."""
    if int_flag(argv, *tp_flags) <= 1:
        return []
    out = []
    if not has_flag(argv, "--disable-custom-all-reduce"):
        out.append(
            Toggle(
                "custom-all-reduce-off",
                (Edit(EditKind.ADD, "--disable-custom-all-reduce"),),
                "the custom all-reduce kernel off (NCCL's instead)",
                (*RANKS_WAIT, Cause.CUDA_GRAPH_CAPTURE),
            )
        )
    out.append(
        Toggle(
            "nccl-p2p-off",
            (Edit(EditKind.ENV, "NCCL_P2P_DISABLE", "1"),),
            "NCCL's peer-to-peer transport off",
            RANKS_WAIT,
        )
    )
    if cumem:
        out.append(
            Toggle(
                "nccl-cumem-off",
                (Edit(EditKind.ENV, "NCCL_CUMEM_ENABLE", "0"),),
                "NCCL's cuMem allocations off",
                RANKS_WAIT,
            )
        )
    out.append(
        Toggle(
            "tp-1",
            (Edit(EditKind.REPLACE, tp_flags[0], "1", aliases=tp_flags[1:]),),
            "tensor parallelism off (one GPU)",
            RANKS_WAIT,
        )
    )
    return out


def attention_toggle(backend: str, current: str | None) -> Toggle:
    """Another attention backend (``--attention-backend``), instead of ``current`` where one is given."""
    return Toggle(
        f"attention-{backend.lower().replace('_', '-')}",
        (Edit(EditKind.REPLACE, "--attention-backend", backend),),
        f"the {backend} attention backend" + (f" instead of {current}" if current else ""),
        (Cause.CUDA_GRAPH_CAPTURE, Cause.COMPILE_STALL, Cause.EXCEPTION),
    )
