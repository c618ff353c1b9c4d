"""SGLang (0.5.23 and the 0.5.10 legacy spellings); a real 0.5.23 CPU boot: docs/sglang-cpu.md."""

from __future__ import annotations

import re
from collections.abc import Sequence

from hangwatch.engines.bootflags import BootFlags
from hangwatch.engines.profile import COMPILE_ON
from hangwatch.engines.profile import CUDA_GRAPHS_OFF
from hangwatch.engines.profile import RANKS_WAIT
from hangwatch.engines.profile import EnvRule
from hangwatch.engines.profile import Profile
from hangwatch.engines.profile import SnapshotPairs
from hangwatch.engines.profile import SpecMetrics
from hangwatch.engines.profile import attention_toggle
from hangwatch.engines.profile import flag_value
from hangwatch.engines.profile import has_flag
from hangwatch.engines.profile import node_rank
from hangwatch.engines.profile import parallel_toggles
from hangwatch.engines.profile import rule
from hangwatch.engines.profile import title_roles
from hangwatch.engines.profile import version_tuple
from hangwatch.model.bench import SpecStats
from hangwatch.model.isolate import Edit
from hangwatch.model.isolate import EditKind
from hangwatch.model.isolate import Toggle
from hangwatch.model.metrics import MetricNames
from hangwatch.model.metrics import MetricsSnapshot
from hangwatch.model.metrics import counter_delta
from hangwatch.model.vocabulary import Cause

_TITLE = re.compile(
    r"^sglang::(?P<role>[a-z_]+?)(?:_(?P<rank>(?:DP|PP|TP|EP|ATTN_CP|MOE_DP)\d+(?:_[A-Z_]+\d+)*))?$"
)


def dummy_health_reason(
    argv: Sequence[str], health_status: int | None, models_status: int | None
) -> str | None:
    """Why this node's /health says nothing about the server, or None when it is the real one.

    SGLang's nodes of ``--node-rank`` 1 and up run no HTTP server: they start
    ``launch_dummy_health_check_server`` (sglang/srt/utils/common.py, called from entrypoints/engine.py),
    a FastAPI app whose ``/ping``, ``/health`` and ``/health_generate`` always answer 200 and which has no
    other route. So a 200 there is no readiness and no progress. Told by behaviour first: the dummy app
    answers 404 to ``/v1/models``, which the real server always serves; the command line's node rank is
    the other sign (it may come from a config file or a wrapper, so it is not required).
    """
    rank = node_rank(argv)
    if health_status != 200:
        return None
    if models_status == 404:
        where = f"node rank {rank}" if rank is not None else "a node that serves no API"
        return (
            f"SGLang's dummy health server ({where}: /health always 200, /v1/models 404): "
            "not readiness, not progress"
        )
    if rank is not None and rank >= 1 and models_status is None:
        return f"SGLang node rank {rank} serves a dummy /health (always 200): not readiness, not progress"
    return None


# `sglang::scheduler_TP0` -> (scheduler, TP0); `sglang::detokenizer` -> (detokenizer, None).
sglang_role = title_roles(_TITLE, "main")

# /metrics (docs/engine-facts.md, "SGLang"): acceptance as gauges over the last decode-log interval.
SPEC_ACCEPT_RATE = "sglang:spec_accept_rate"
SPEC_ACCEPT_LENGTH = "sglang:spec_accept_length"
SPEC_VERIFY_CALLS = "sglang:spec_verify_calls_total"
METRICS = MetricNames(
    "sglang", "sglang:generation_tokens_total", "sglang:prompt_tokens_total", "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
)  # fmt: skip


def _gauge_mean(snapshot: MetricsSnapshot, name: str) -> float | None:
    """A gauge exposed once per rank or engine: the mean, since a sum of rates means nothing."""
    values = [s.value for s in snapshot.samples.get(name, ())]
    return sum(values) / len(values) if values else None


def spec_stats(pairs: SnapshotPairs) -> SpecStats | None:
    """Gauges of the last decode-log interval: read after the run (the first round's start to the last's
    end for the verify calls)."""
    if not pairs:
        return None
    before, after = pairs[0][0], pairs[-1][1]
    length = _gauge_mean(after, SPEC_ACCEPT_LENGTH)
    rate = _gauge_mean(after, SPEC_ACCEPT_RATE)
    if length is None and rate is None:
        return None
    verified = counter_delta(before, after, SPEC_VERIFY_CALLS)
    if not length and not rate and not verified:
        return None  # the gauges exist at 0 on a server without speculative decoding
    return SpecStats(
        engine="sglang",
        acceptance_rate=rate,
        mean_acceptance_length=length,
        per_position=(),
        source="sglang:spec_accept_rate / spec_accept_length after the run (its last decode-log interval)",
    )


_CAPTURE_BEGIN = (
    r"Capture (?:cuda graph|cpu graph"
    r"|(?:target|draft) (?:decode|verify|prefill|extend) (?:CUDA|CPU|NPU) graph"
    r"|draft (?:extend )?cuda graph|piecewise CUDA graph) begin"
)

_TP_FLAGS = ("--tp-size", "--tensor-parallel-size", "--tp")
_GRAPHS_OFF_FLAGS = (
    "--disable-cuda-graph",
    "--disable-decode-cuda-graph",
    "--disable-prefill-cuda-graph",
)
_GRAPH_BACKENDS = ("--cuda-graph-backend-decode", "--cuda-graph-backend-prefill")
# 0.5.23 deprecates --disable-cuda-graph (still accepted) for --cuda-graph-backend-{decode,prefill}.
_GRAPH_BACKEND_SINCE = (0, 5, 23)
_ATTENTION = ("triton", "torch_native", "flashinfer", "fa3")


def _graphs_off(argv: tuple[str, ...], version: str | None) -> Toggle | None:
    if has_flag(argv, *_GRAPHS_OFF_FLAGS) or all(flag_value(argv, f) == "disabled" for f in _GRAPH_BACKENDS):
        return None
    why = "CUDA graphs off"
    causes = (Cause.CUDA_GRAPH_CAPTURE, Cause.GPU_SPIN, *RANKS_WAIT)
    parsed = version_tuple(version)
    if parsed is not None and parsed >= _GRAPH_BACKEND_SINCE:
        edits = tuple(Edit(EditKind.REPLACE, f, "disabled") for f in _GRAPH_BACKENDS)
        return Toggle("graphs-off", edits, why, causes)
    return Toggle("graphs-off", (Edit(EditKind.ADD, "--disable-cuda-graph"),), why, causes)


def sglang_toggles(argv: tuple[str, ...], version: str | None) -> tuple[Toggle, ...]:
    """What ``hangwatch isolate`` tries on an SGLang command, each only where it changes something here."""
    out: list[Toggle] = []
    if has_flag(argv, "--speculative-*"):
        out.append(
            Toggle(
                "no-spec",
                (Edit(EditKind.REMOVE, "--speculative-*"),),
                "speculative decoding off",
                (Cause.CUDA_GRAPH_CAPTURE, *RANKS_WAIT),
            )
        )
    graphs = _graphs_off(argv, version)
    if graphs is not None:
        out.append(graphs)
    out += parallel_toggles(argv, _TP_FLAGS, cumem=False)
    backend = flag_value(argv, "--attention-backend")
    for other in _ATTENTION:
        if other != backend and (backend is not None or other == "triton"):
            out.append(attention_toggle(other, backend))
    return tuple(out)


# docs/engine-facts.md: what SGLang does with the environment it is given.
ENV_RULES = (
    EnvRule(
        "sglang-sets-cumem",
        lambda s: "sglang" in s.cmd and "NCCL_CUMEM_ENABLE" not in s.env,
        lambda s: "SGLang sets NCCL_CUMEM_ENABLE (usually 0) and NCCL_NVLS_ENABLE itself when they are unset",
        "note",
        after="launch-blocking",
    ),
)

SGLANG = Profile(
    name="sglang",
    display_name="SGLang",
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
    toggles=sglang_toggles,
    distribution="sglang",
    metrics=METRICS,
    openai_api=True,
    extra_phase_labels={"draft_weights": "loading the draft model", "ready": "serving"},
    # Scheduler lines carry their rank after the time ("[2026-12-01 21:39:30 TP1] ..."; DP/PP/EP parts too
    # when set), at TP=1 none; the launcher's lines never do.
    line_source=re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?(?P<source>(?: [A-Z_]+\d+)+)\]"),
    # "[2026-12-02 06:43:29 TP1] message"
    log_prefixes=(r"\[[^\]]{1,80}\] ",),
    writer_rank=re.compile(r"^\[[^\]]*?\b(?P<rank>(?:TP|DP|PP|EP)\d+)\]"),
    fatal_lines=(r"Scheduler hit an exception", r"Initialization failed\."),
    kernel_namespaces=(("sglang::", "SGLang"),),
    next_step_flags={CUDA_GRAPHS_OFF: "--disable-cuda-graph", COMPILE_ON: "--enable-torch-compile"},
    distributions=("sglang", "sgl-kernel"),
    env_rules=ENV_RULES,
    spec=SpecMetrics(
        spec_stats,
        "sglang:spec_*",
        (SPEC_VERIFY_CALLS,),
        absent="the server exposes no speculative-decoding acceptance (sglang:spec_accept_* absent or 0)",
        caveat="SGLang exposes acceptance only as gauges over its last 40 decode steps",
    ),
    boot=BootFlags(
        tp=("--tp-size", "--tensor-parallel-size", "--tp"),
        pp=("--pp-size", "--pipeline-parallel-size", "--pp"),
        dp=("--dp-size", "--data-parallel-size", "--dp"),
        ep=("--ep-size", "--expert-parallel-size", "--ep"),
        switches=(
            ("--disable-cuda-graph", False),
            ("--cuda-graph-backend-decode", True),
            ("--cuda-graph-backend-prefill", True),
            ("--enable-torch-compile", False),
            ("--attention-backend", True),
            ("--quantization", True),
            ("--kv-cache-dtype", True),
            ("--load-format", True),
            ("--speculative-algorithm", True),
        ),
        versions=("sglang",),
    ),
    # Node ranks >= 1 answer /health from a dummy server: the real one always serves /v1/models.
    dummy_probe_path="/v1/models",
    dummy_health=dummy_health_reason,
)
