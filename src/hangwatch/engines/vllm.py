"""vLLM V1 (0.33 and the CPU build 0.32): phase lines from ../shared/reference/engines.md §2.3, §6, §8."""

from __future__ import annotations

import re

from hangwatch.engines.profile import Profile
from hangwatch.engines.profile import rule

_TITLE = re.compile(r"^VLLM::(?P<role>[A-Za-z]+)(?:_(?P<rank>[A-Z]+\d+(?:_[A-Z]+\d+)*))?$")


def vllm_role(
    title: str, cmdline: tuple[str, ...], is_root: bool, env: dict[str, str]
) -> tuple[str | None, str | None]:
    """``VLLM::Worker_TP1`` -> (Worker, TP1); ``VLLM::EngineCore`` -> (EngineCore, None)."""
    m = _TITLE.match(title)
    if m:
        return m.group("role"), m.group("rank")
    if is_root:
        return "APIServer", None
    return None, None


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
    extra_phase_labels={"ready": "serving"},
)
