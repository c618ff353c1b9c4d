"""What an engine profile knows, as data: phase lines, "still waiting" lines, readiness, names."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field

from hangwatch.model.isolate import Edit
from hangwatch.model.isolate import EditKind
from hangwatch.model.isolate import Toggle
from hangwatch.model.metrics import MetricNames
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


@dataclass(frozen=True)
class Profile:
    name: str
    phases: tuple[PhaseRule, ...]
    role_of: RoleOf
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
