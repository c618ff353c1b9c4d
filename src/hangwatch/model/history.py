"""Phase history: what makes two boots comparable (``BootKey``), the phase durations of one boot, the usual
range of a phase over the boots of one configuration, and how this boot's phases stand against it.

Stored by ``collect/historydb.py``, drawn by ``analyse/history.py``, recorded at the end of every supervised
launch (``supervise/history.py``), listed by ``hangwatch history``. The JSON contract of ``hangwatch history
--json`` is ``HISTORY_SCHEMA``; a run report carries a ``HistoryComparison`` as ``phase_history``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from enum import StrEnum

from hangwatch.words import human_bytes

HISTORY_SCHEMA = "hangwatch.history/1"

# How the usual range of a phase is drawn, said with every comparison and listing so that a reader can
# weigh it: the most recent boots only (a driver or engine update shifts durations; old boots then age
# out), and one odd boot at either end does not widen the range once there are enough to leave it out.
RECENT_BOOTS = 10

# --stall-after auto: a boot phase's stall window from its longest quiet spells in earlier boots of a
# comparable configuration (same engine, model or program, parallel sizes, switches and host; any version,
# GPU or cache state: the longest of them all, so that a cold boot's longer silences are covered). A false
# stall kills a boot that would have finished: twice the longest spell seen plus a margin, never under the
# floor, and only from enough boots; a phase without them keeps the fixed window.
AUTO_FACTOR = 2.0
AUTO_MARGIN_S = 10.0
AUTO_FLOOR_S = 20.0
AUTO_MIN_BOOTS = 3
TRIM_FROM = 5  # with this many boots or more, the lowest and the highest are left out
AUTO_RULE = (
    f"each boot phase: {AUTO_FACTOR:g} x its longest quiet spell in the last {RECENT_BOOTS} comparable boots "
    f"+ {AUTO_MARGIN_S:g} s, at least {AUTO_FLOOR_S:g} s, from {AUTO_MIN_BOOTS} boots on; other phases and "
    "serving: the fixed window"
)
USUAL_RULE = (
    f"the last {RECENT_BOOTS} recorded boots of this configuration; from {TRIM_FROM} boots on, "
    "the fastest and the slowest left out"
)


@dataclass(frozen=True)
class BootKey:
    """What a boot's phase durations depend on: two boots with equal keys are expected to take alike."""

    engine: str  # the engine profile: "vllm", "sglang", "generic"
    engine_version: str | None  # its installed distribution's ("0.11.0"); generic: torch's; None: unknown
    model: str | None  # --model / --model-path / `vllm serve M`: a local path or a hub id (redacted)
    model_bytes: int | None  # weights on disk for a local checkpoint folder; None for a hub id or unknown
    # What a command that names no model runs (``/abs/train.py``, ``-m pkg.mod``, ``torchrun``): without it
    # every generic program on a host would share one history.
    program: str | None
    tp: int
    pp: int
    dp: int
    ep: int
    # Command-line switches known to change what a boot does (--enforce-eager skips the graph capture,
    # another attention backend compiles other kernels): "enforce-eager", "attention-backend=FLASHINFER".
    switches: tuple[str, ...]
    gpu_model: str | None  # "NVIDIA H200" (mixed: "NVIDIA H200 + NVIDIA A100"); None without NVML
    gpu_count: int  # GPUs NVML saw on the host; 0 without NVML
    host: str
    # A compile cache (vLLM, Inductor, Triton, FlashInfer, CUDA JIT) held entries from before the boot
    # started: a cold boot compiles what a warm one loads, and takes minutes longer.
    caches_warm: bool

    @property
    def key_id(self) -> str:
        """12 hex digits of the key's SHA-256: the name ``hangwatch history --forget`` takes."""
        text = json.dumps(asdict(self), sort_keys=True, ensure_ascii=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def describe(self) -> str:
        """``vllm 0.11.0 · /models/llama (15.0 GiB) · TP 2 · 2x NVIDIA H200 · host gpu1 · caches warm``."""
        parts = [f"{self.engine} {self.engine_version}" if self.engine_version else self.engine]
        what = self.model or self.program
        if what:
            parts.append(what + (f" ({human_bytes(self.model_bytes)})" if self.model_bytes else ""))
        sizes = (("TP", self.tp), ("PP", self.pp), ("DP", self.dp), ("EP", self.ep))
        parallel = [f"{name} {size}" for name, size in sizes if size != 1]
        if parallel:
            parts.append(" ".join(parallel))
        parts.extend(self.switches)
        parts.append(
            f"{self.gpu_count}x {self.gpu_model}" if self.gpu_count and self.gpu_model else "no GPU seen"
        )
        parts.append(f"host {self.host}")
        parts.append("caches warm" if self.caches_warm else "caches cold")
        return " · ".join(parts)


@dataclass(frozen=True)
class PhaseDuration:
    phase: str
    seconds: float
    quiet_s: float | None = None  # its longest quiet spell (None: not known, a boot recorded before 2)


@dataclass(frozen=True)
class BootRecord:
    """One boot as the history keeps it: the phases that ran to their end (analyse.history.recordable)."""

    started_at: str  # the report's wall clock, ISO 8601
    verdict: str  # the verdict's state: "ready", "stalled", ...
    mode: str  # the report's mode ("run"; isolate's trials are runs too)
    phases: tuple[PhaseDuration, ...]


@dataclass(frozen=True)
class PastBoots:
    """What the history holds for one configuration, as stored: the durations of each phase, the most
    recent boot's first, phases in the order the most recent boot that ran them ran them."""

    key_id: str
    key: BootKey
    boots: int
    first_at: str  # the first and the last recorded boot's start, ISO 8601 ("" when none)
    last_at: str
    durations: dict[str, tuple[float, ...]]
    # Each phase's longest quiet spells, the most recent boot's first (boots that knew them only).
    quiet: dict[str, tuple[float, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class PhaseHistory:
    """The usual duration of one phase of one configuration: ``lo_s``-``hi_s`` over ``boots`` (USUAL_RULE)."""

    phase: str
    lo_s: float
    hi_s: float
    boots: int  # the boots the range is drawn from (at most RECENT_BOOTS)
    recorded: int = 0  # every boot the history holds for this phase (the range looks at the recent ones)
    last_s: float | None = None  # the most recent boot's


class Standing(StrEnum):
    """Where this boot's duration of a phase falls against its usual range."""

    WITHIN = "within"
    LONGER = "longer"  # past the usual range by more than the margin (analyse/history.py)
    SHORTER = "shorter"


@dataclass(frozen=True)
class PhaseHistoryLine:
    """One phase of this boot against its history: "cuda_graph: 95 s (usual 60-70 s, 5 boots)"."""

    phase: str
    duration_s: float  # this boot's; for the phase it stopped in, how long it had run by then
    finished: bool  # False: the phase this boot was still in at the verdict
    usual: PhaseHistory
    standing: Standing


@dataclass(frozen=True)
class HistoryComparison:
    """A run report's history: the configuration, this boot's phases against the boots before it (read
    before this one was added), and whether this boot was recorded."""

    key_id: str
    key: BootKey
    earlier_boots: int  # boots of this configuration before this one
    lines: tuple[PhaseHistoryLine, ...]
    recorded: bool  # this boot's finished phases were added (False: none finished, or history is off)
    rule: str = USUAL_RULE


@dataclass(frozen=True)
class ConfigHistory:
    """One configuration as ``hangwatch history`` lists it."""

    key_id: str
    key: BootKey
    boots: int
    first_at: str  # the first and the last recorded boot's start, ISO 8601
    last_at: str
    phases: tuple[PhaseHistory, ...]  # in the order the most recent boot ran them


@dataclass(frozen=True)
class HistoryListing:
    """``hangwatch history --json``: every configuration, the most recently booted first."""

    schema: str
    path: str
    rule: str
    configurations: tuple[ConfigHistory, ...]
    notes: tuple[str, ...] = ()  # the database set aside, or left alone (a newer hangwatch's)


@dataclass(frozen=True)
class PhaseWindow:
    """One boot phase's stall window under --stall-after auto, and what it was drawn from."""

    phase: str
    window_s: float
    longest_quiet_s: float  # the longest quiet spell of that phase in the boots read
    boots: int


@dataclass(frozen=True)
class LaunchHistory:
    """What the history says before a launch, from the earlier boots of comparable configurations
    (analyse.history.comparable): each phase's usual duration, for the live view, and, under
    --stall-after auto, each phase's stall window."""

    usual: tuple[PhaseHistory, ...] = ()
    windows: tuple[PhaseWindow, ...] = ()
    notes: tuple[str, ...] = ()  # a history that could not be read (set aside, held by another run)
