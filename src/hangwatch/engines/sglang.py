"""SGLang (0.5.23 and the 0.5.10 legacy spellings); a real 0.5.23 CPU boot: docs/sglang-cpu.md."""

from __future__ import annotations

import re

from hangwatch.engines.profile import Profile
from hangwatch.engines.profile import rule

_TITLE = re.compile(
    r"^sglang::(?P<role>[a-z_]+?)(?:_(?P<rank>(?:DP|PP|TP|EP|ATTN_CP|MOE_DP)\d+(?:_[A-Z_]+\d+)*))?$"
)


def sglang_role(
    title: str, cmdline: tuple[str, ...], is_root: bool, env: dict[str, str]
) -> tuple[str | None, str | None]:
    """``sglang::scheduler_TP0`` -> (scheduler, TP0); ``sglang::detokenizer`` -> (detokenizer, None)."""
    m = _TITLE.match(title)
    if m:
        return m.group("role"), m.group("rank")
    if is_root:
        return "main", None
    return None, None


_CAPTURE_BEGIN = (
    r"Capture (?:cuda graph|cpu graph"
    r"|(?:target|draft) (?:decode|verify|prefill|extend) (?:CUDA|CPU|NPU) graph"
    r"|draft (?:extend )?cuda graph|piecewise CUDA graph) begin"
)

SGLANG = Profile(
    name="sglang",
    command_markers=(re.compile(r"sglang(?:\.launch_server|\s+serve|::)"),),
    phases=(
        # server_args= is the launcher's first line; the schedulers it then spawns log nothing until
        # "Init parallel begin." (each imports sglang first: 10-30 s on a loaded CPU machine).
        rule("args", "starting the scheduler processes", r"server_args="),
        rule("dist_init", "initialising distributed groups", r"Init (?:torch distributed|parallel) begin"),
        rule("weights", "loading weights", r"Load weight begin", again="draft_weights"),
        rule("weights_loaded", "weights loaded", r"Load weight end"),
        rule(
            "kv_alloc",
            "allocating the KV cache",
            r"KV Cache is allocated",
            r"Memory pool end",
            r"KV Cache VA upper bound",
        ),
        rule(
            "cuda_graph",
            "capturing CUDA graphs",
            _CAPTURE_BEGIN,
            r"Capturing batches \(bs=",
            r"Capturing prefill shape",
        ),
        rule("scheduler_ready", "schedulers ready", r"max_total_num_tokens=", r"Engine startup timings"),
        rule("http_up", "HTTP server up, warming up", r"Uvicorn running on", r"Application startup complete"),
    ),
    ready_patterns=(re.compile(r"The server is fired up and ready to roll!"),),
    health_path="/health",
    default_port=30000,
    role_of=sglang_role,
    extra_phase_labels={"draft_weights": "loading the draft model", "ready": "serving"},
    # Scheduler lines carry their rank after the time ("[2026-12-01 21:39:30 TP1] ..."; DP/PP/EP parts too
    # when set), at TP=1 none; the launcher's lines never do.
    line_source=re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?(?P<source>(?: [A-Z_]+\d+)+)\]"),
)
