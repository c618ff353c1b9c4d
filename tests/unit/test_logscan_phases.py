"""Engine profiles on the engines' real log lines (from ../shared/reference/engines.md)."""

from __future__ import annotations

import pytest

from hangwatch import engines
from hangwatch.analyse.logscan import LogScanner
from hangwatch.analyse.phases import PhaseTracker
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
    scanner = LogScanner(engines.by_name("sglang"), probe_echo=lambda: ('"GET /health HTTP', ":51234"))
    lines = (
        '[2026-11-29 06:52:10] INFO:     127.0.0.1:51234 - "GET /health HTTP/1.1" 503 Service Unavailable',
    )
    assert scanner.scan(lines, 90, 1.0).progress_lines == 0


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
