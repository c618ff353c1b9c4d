"""vLLM V1 (0.33 and the CPU build 0.32): phase lines: docs/engine-facts.md."""

from __future__ import annotations

import re

from hangwatch.engines.profile import RANKS_WAIT
from hangwatch.engines.profile import Profile
from hangwatch.engines.profile import attention_toggle
from hangwatch.engines.profile import flag_value
from hangwatch.engines.profile import has_flag
from hangwatch.engines.profile import parallel_toggles
from hangwatch.engines.profile import rule
from hangwatch.engines.profile import title_roles
from hangwatch.model.isolate import Edit
from hangwatch.model.isolate import EditKind
from hangwatch.model.isolate import Toggle
from hangwatch.model.metrics import MetricNames
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


VLLM = Profile(
    name="vllm",
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
)
