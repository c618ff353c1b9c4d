"""Engine profiles on the engines' real log lines (SGLang 0.5.23 on CPU as measured: docs/sglang-cpu.md)."""

from __future__ import annotations

import pytest

from hangwatch import engines
from hangwatch.analyse.logscan import LogScanner
from hangwatch.analyse.phases import PhaseTracker
from hangwatch.model.samples import ProbeMarks
from hangwatch.model.vocabulary import Cause

VLLM_CPU_BOOT = [
    "(APIServer pid=100) INFO 11-29 06:50:02 [utils.py:300] non-default args: {'model': '/m', 'port': 8000}",
    "(APIServer pid=100) INFO 11-29 06:50:03 [model.py:744] Resolved architecture: LlamaForCausalLM",
    "(EngineCore pid=200) INFO 11-29 06:50:09 [core.py:140] Initializing a V1 LLM engine (v0.32.0) with config: ...",
    "(Worker pid=300) INFO 11-29 06:50:14 [parallel_state.py:1929] world_size=1 rank=0 local_rank=0 "
    "distributed_init_method=file:///tmp/x backend=gloo",
    "(Worker pid=300) INFO 11-29 06:50:15 [cpu_model_runner.py:68] Starting to load model /m...",
    "Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 80.1it/s]",
    "(Worker pid=300) INFO 11-29 06:50:15 [default_loader.py:506] Loading weights took 0.01 seconds",
    "(Worker pid=300) INFO 11-29 06:50:15 [cpu_model_runner.py:80] Warming up model for the compilation...",
    "(Worker pid=300) INFO 11-29 06:51:00 [monitor.py:92] Initial profiling/warmup run took 44.20 s",
    "(Worker pid=300) INFO 11-29 06:51:01 [cpu_worker.py:204] Auto set (1.71/7.96) GiB for KV cache on node 0, ...",
    "(EngineCore pid=200) INFO 11-29 06:51:01 [kv_cache_utils.py:1136] CPU KV cache size: 3,583,360 tokens, ...",
    "(EngineCore pid=200) INFO 11-29 06:51:02 [core.py:393] init engine (profile, create kv cache, warmup model) "
    "took 49.59 s",
    "(APIServer pid=100) INFO 11-29 06:51:03 [entry.py:135] Supported tasks: ['generate']",
    "(APIServer pid=100) INFO:     Application startup complete.",
]

SGLANG_EAGLE3_BOOT = [
    "[2026-11-29 06:50:00] server_args=ServerArgs(model_path='m', tp_size=8, ...)",
    "[2026-11-29 06:50:02 TP0] Init torch distributed begin.",
    "[2026-11-29 06:50:03 TP0] Init torch distributed ends. elapsed=0.31 s, mem usage=0.00 GB",
    "[2026-11-29 06:50:03 TP0] Load weight begin. avail mem=139.28 GB",
    "[2026-11-29 06:50:03 TP1] Load weight begin. avail mem=139.27 GB",
    "[2026-11-29 06:50:25 TP0] Load weight end. elapsed=22.00 s, type=DeepseekV3ForCausalLM, avail mem=63.1 GB, mem usage=76.1 GB.",
    "[2026-11-29 06:50:25 TP1] Load weight end. elapsed=22.00 s, type=DeepseekV3ForCausalLM, avail mem=63.1 GB, mem usage=76.1 GB.",
    "[2026-11-29 06:50:25 TP0] Load weight begin. avail mem=63.1 GB",
    "[2026-11-29 06:50:26 TP0] Load weight end. elapsed=1.00 s, type=LlamaForCausalLMEagle3, avail mem=62.1 GB, mem usage=1.0 GB.",
    "[2026-11-29 06:50:26 TP0] KV Cache is allocated. #tokens: 100000, K size: 10.00 GB, V size: 10.00 GB",
    "[2026-11-29 06:50:27 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=40.00 GB",
]


def _phases(profile_name: str, lines: list[str]) -> list[str]:
    profile = engines.by_name(profile_name)
    scanner = LogScanner(profile)
    tracker = PhaseTracker(profile)
    for i, line in enumerate(lines):
        for event in scanner.scan((line,), len(line), float(i)).phase_events:
            tracker.observe(event)
    return [s.name for s in tracker.spans()]


def test_vllm_cpu_boot_phases():
    assert _phases("vllm", VLLM_CPU_BOOT) == [
        "process_start",
        "args",
        "engine_core",
        "dist_init",
        "weights",
        "model_loaded",
        "compile",
        "profile",
        "kv_alloc",
        "engine_ready",
        "http_starting",
    ]


def test_sglang_draft_model_loads_as_its_own_phase_and_ranks_do_not_move_phases_back():
    assert _phases("sglang", SGLANG_EAGLE3_BOOT) == [
        "process_start",
        "args",
        "dist_init",
        "weights",
        "weights_loaded",
        "draft_weights",
        "weights_loaded",
        "kv_alloc",
        "cuda_graph",
    ]


# SGLang 0.5.23 on its CPU engine, TP=2, as logged on 2026-12-01 (docs/sglang-cpu.md); lines shortened where
# they run on. TP1 loads its (dummy) weights and finishes before TP0 starts: one rank's first
# "Load weight begin" after the other's "Load weight end" is not a draft model.
SGLANG_CPU_TP2_BOOT = [
    "[2026-12-01 21:39:13] server_args={'model_path': '/m', 'tokenizer_path': '/m', 'load_format': 'dummy', ...}",
    "[2026-12-01 21:39:13] The current platform does not support Intel AMX, will fallback to torch_native backend.",
    "[2026-12-01 21:39:15] Fail to set RLIMIT_NOFILE: current limit exceeds maximum limit",
    "[2026-12-01 21:39:29 TP1] Init parallel begin.",
    "[2026-12-01 21:39:29 TP1] init_threads_binding: numa_index=1, world_size=2, local_omp_cpuid=1",
    "[2026-12-01 21:39:29 TP0] Init parallel begin.",
    "[2026-12-01 21:39:29 TP0] Init parallel ends. elapsed=0.32 s",
    "[2026-12-01 21:39:29 TP1] Init parallel ends. elapsed=0.41 s",
    "[2026-12-01 21:39:29 TP0] Memory baseline taken. mem usage=0.00 GB",
    "[2026-12-01 21:39:30 TP1] Load weight begin. avail mem=21.24 GB",
    "[2026-12-01 21:39:30 TP1] Load weight end. elapsed=0.01 s, type=LlamaForCausalLM, avail mem=21.23 GB, mem usage=0.00 GB.",
    "[2026-12-01 21:39:30 TP0] Load weight begin. avail mem=21.23 GB",
    "[2026-12-01 21:39:30 TP0] Load weight end. elapsed=0.01 s, type=LlamaForCausalLM, avail mem=21.23 GB, mem usage=0.00 GB.",
    "[2026-12-01 21:39:31 TP0] KV Cache is allocated. dtype: torch.float16, #tokens: 4096, K size: 0.00 GB, V size: 0.00 GB",
    "[2026-12-01 21:39:31 TP1] KV Cache is allocated. dtype: torch.float16, #tokens: 4096, K size: 0.00 GB, V size: 0.00 GB",
    "[2026-12-01 21:39:31 TP0] Memory pool end. avail mem=21.20 GB",
    "[2026-12-01 21:39:31 TP0] Disable prefill CUDA graph because cuda_graph_config resolved prefill.backend='disabled' "
    "(e.g. via --cuda-graph-backend-prefill=disabled or auto-disable rules).",
    "[2026-12-01 21:39:31 TP0] max_total_num_tokens=4096, chunked_prefill_size=4096, max_prefill_tokens=16384, "
    "max_running_requests=2048, context_len=1024, available_cpu_mem=21.20 GB",
    "[2026-12-01 21:39:31] Engine startup timings (s): load_weight=0.01, kv_cache_allocation=0.52, scheduler_e2e=1.92, "
    "cuda_graph={prefill=0.00, decode=0.00, target_verify=0.00, draft_prefill=0.00, draft_decode=0.00, draft_extend=0.00}, "
    "tokenizer_e2e=16.1",
    "[2026-12-01 21:39:31] INFO:     Started server process [19082]",
    "[2026-12-01 21:39:31] INFO:     Waiting for application startup.",
    "[2026-12-01 21:39:31] INFO:     Application startup complete.",
    "[2026-12-01 21:39:31] INFO:     Uvicorn running on http://127.0.0.1:34421 (Press CTRL+C to quit)",
    '[2026-12-01 21:39:32] INFO:     127.0.0.1:39944 - "GET /health HTTP/1.1" 503 Service Unavailable',
    '[2026-12-01 21:39:32] INFO:     127.0.0.1:39948 - "GET /model_info HTTP/1.1" 200 OK',
    "[2026-12-01 21:39:35 TP0] Prefill batch, #new-seq: 1, #new-token: 27, #cached-token: 0, token usage: 0.01, "
    "#running-req: 0, #queue-req: 0, #pending-token: 0, cpu graph: False, input throughput (token/s): 7.02",
    '[2026-12-01 21:39:35] INFO:     127.0.0.1:39956 - "POST /generate HTTP/1.1" 200 OK',
    '[2026-12-01 21:39:35] INFO:     127.0.0.1:39968 - "POST /freeze_gc HTTP/1.1" 200 OK',
    "[2026-12-01 21:39:35] The server is fired up and ready to roll!",
]

SGLANG_CPU_PHASES = [
    "process_start",
    "args",
    "dist_init",
    "weights",
    "weights_loaded",
    "kv_alloc",
    "scheduler_ready",
    "http_up",
]


def test_sglang_cpu_tp2_boot_phases_from_real_lines():
    assert _phases("sglang", SGLANG_CPU_TP2_BOOT) == SGLANG_CPU_PHASES


# The same server at TP=1: the scheduler's lines carry no rank tag.
SGLANG_CPU_TP1_BOOT = [
    "[2026-12-01 21:38:19] server_args={'model_path': '/m', 'tokenizer_path': '/m', 'load_format': 'dummy', ...}",
    "[2026-12-01 21:38:41] Init parallel begin.",
    "[2026-12-01 21:38:41] Init parallel ends. elapsed=0.02 s",
    "[2026-12-01 21:38:43] Load weight begin. avail mem=19.87 GB",
    "[2026-12-01 21:38:43] Load weight end. elapsed=0.03 s, type=LlamaForCausalLM, avail mem=19.86 GB, mem usage=0.01 GB.",
    "[2026-12-01 21:38:43] KV Cache is allocated. dtype: torch.float16, #tokens: 4096, K size: 0.00 GB, V size: 0.00 GB",
    "[2026-12-01 21:38:43] Memory pool end. avail mem=19.85 GB",
    "[2026-12-01 21:38:43] max_total_num_tokens=4096, chunked_prefill_size=4096, max_prefill_tokens=16384, "
    "max_running_requests=2048, context_len=1024, available_cpu_mem=19.85 GB",
    "[2026-12-01 21:38:43] Engine startup timings (s): load_weight=0.03, kv_cache_allocation=0.59, scheduler_e2e=2.12, "
    "cuda_graph={prefill=0.00, decode=0.00, target_verify=0.00, draft_prefill=0.00, draft_decode=0.00, draft_extend=0.00}, "
    "tokenizer_e2e=10.72",
    "[2026-12-01 21:38:43] INFO:     Started server process [18330]",
    "[2026-12-01 21:38:43] INFO:     Application startup complete.",
    "[2026-12-01 21:38:43] INFO:     Uvicorn running on http://127.0.0.1:35029 (Press CTRL+C to quit)",
    "[2026-12-01 21:38:45] The server is fired up and ready to roll!",
]


def test_sglang_cpu_tp1_boot_phases_from_real_lines():
    assert _phases("sglang", SGLANG_CPU_TP1_BOOT) == SGLANG_CPU_PHASES
    scanner = LogScanner(engines.by_name("sglang"))
    assert scanner.scan((SGLANG_CPU_TP1_BOOT[-1],), 10, 0.0).ready_line


def test_sglang_tp1_draft_model_still_opens_draft_weights():
    # Untagged lines share one source: a second "Load weight begin" after "Load weight end" is the draft.
    lines = [*SGLANG_CPU_TP1_BOOT[3:5], "[2026-12-01 21:38:44] Load weight begin. avail mem=19.80 GB"]
    assert _phases("sglang", lines)[-1] == "draft_weights"


def test_sglang_line_source_is_the_rank_tag():
    sglang = engines.by_name("sglang")
    assert sglang.source_of("[2026-12-01 21:39:30 TP1] Load weight begin. avail mem=21.24 GB") == " TP1"
    assert sglang.source_of("[2026-12-01 21:39:30.123 DP0 TP3] Load weight begin.") == " DP0 TP3"
    assert sglang.source_of("[2026-12-01 21:39:31] INFO:     Application startup complete.") == ""
    assert engines.by_name("vllm").source_of("[2026-12-01 21:39:30 TP1] x") == ""


def test_sglang_current_spellings():
    lines = [
        "[2026-11-29 06:50:02 TP0] Init parallel begin.",
        "[2026-11-29 06:50:03 TP0] Load weight begin. avail mem=139.28 GB",
        "[2026-11-29 06:50:40 TP0] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=9 GB",
    ]
    assert _phases("sglang", lines)[-1] == "cuda_graph"


def test_describe_names_the_neighbouring_phases():
    profile = engines.by_name("sglang")
    tracker = PhaseTracker(profile)
    scanner = LogScanner(profile)
    for i, line in enumerate(SGLANG_EAGLE3_BOOT[:6]):
        for e in scanner.scan((line,), 1, float(i)).phase_events:
            tracker.observe(e)
    text = tracker.describe(100.0)
    assert text.startswith("weights_loaded (weights loaded")
    assert "after loading weights" in text and "before allocating the KV cache" in text


def test_still_waiting_lines_are_not_progress():
    scanner = LogScanner(engines.by_name("vllm"))
    line = (
        "(EngineCore pid=200) INFO 11-29 06:52:00 [shm_broadcast.py:871] No available shared memory broadcast "
        "block found in 60 seconds. This typically happens when some processes are hanging or doing some "
        "time-consuming work (e.g. compilation, weight/kv cache quantization)."
    )
    sample = scanner.scan((line,), len(line), 1.0)
    assert sample.new_lines == 1 and sample.waiting_lines == 1 and sample.progress_lines == 0


def test_probe_echo_lines_are_not_progress():
    scanner = LogScanner(engines.by_name("sglang"))
    lines = (
        '[2026-11-29 06:52:10] INFO:     127.0.0.1:51234 - "GET /health HTTP/1.1" 503 Service Unavailable',
    )
    marks = ProbeMarks(echo_markers=('"GET /health HTTP', ":51234"))
    assert scanner.scan(lines, 90, 1.0, marks=marks).progress_lines == 0
    # The same line, with no probe of ours to have caused it, is the server's own news.
    assert LogScanner(engines.by_name("sglang")).scan(lines, 90, 1.0).progress_lines == 1


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity",
            Cause.CUDA_OOM,
        ),
        ("OSError: [Errno 98] Address already in use", Cause.PORT_IN_USE),
        ("Traceback (most recent call last):", Cause.EXCEPTION),
        ("ValueError: head_dim 16 is not supported", Cause.EXCEPTION),
        (
            "(EngineCore pid=200) ERROR 11-29 06:52:10 [core.py:1] Engine core initialization failed. See root cause above.",
            Cause.EXCEPTION,
        ),
    ],
)
def test_findings(line, cause):
    (finding,) = LogScanner(engines.by_name("generic")).scan((line,), len(line), 0.0).findings
    assert finding.cause is cause


def test_ready_line_and_detection_from_command_lines():
    assert (
        LogScanner(engines.by_name("sglang"))
        .scan(("[2026-11-29 06:52:12] The server is fired up and ready to roll!",), 10, 0.0)
        .ready_line
    )
    assert engines.detect(["python", "-m", "vllm.entrypoints.openai.api_server"]).name == "vllm"
    assert engines.detect(["vllm", "serve", "m"]).name == "vllm"
    assert engines.detect(["python3", "-m", "sglang.launch_server", "--model-path", "m"]).name == "sglang"
    assert engines.detect(["torchrun", "train.py"]).name == "generic"


def test_roles_and_health_urls():
    vllm, sglang = engines.by_name("vllm"), engines.by_name("sglang")
    assert vllm.role_of("VLLM::Worker_TP1", (), False, {}) == ("Worker", "TP1")
    assert vllm.role_of("VLLM::EngineCore", (), False, {}) == ("EngineCore", None)
    assert sglang.role_of("sglang::scheduler_DP0_TP3", (), False, {}) == ("scheduler", "DP0_TP3")
    assert sglang.role_of("sglang::detokenizer", (), False, {}) == ("detokenizer", None)
    assert engines.by_name("generic").role_of("python", (), False, {"RANK": "3"}) == ("rank", "3")
    assert (
        vllm.health_url(["vllm", "serve", "m", "--host", "0.0.0.0", "--port", "9000"])
        == "http://127.0.0.1:9000/health"
    )
    assert sglang.health_url(["python", "-m", "sglang.launch_server"]) == "http://127.0.0.1:30000/health"
