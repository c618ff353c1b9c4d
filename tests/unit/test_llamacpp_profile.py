"""The llama.cpp profile (engines/llamacpp.py) on llama-cpp-python 0.3.36's real output.

The fixture is one real run of ``python -m llama_cpp.server`` on tests/e2e/tiny_gguf.py's model (2-core
machine, 2026-12-06): the whole boot, probes of /health, /v1/models, /metrics, /docs and /openapi.json, a
completion, a chat completion, then SIGTERM.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hangwatch import engines
from hangwatch.analyse.logscan import LogScanner
from hangwatch.analyse.phases import PhaseTracker
from hangwatch.engines.llamacpp import LLAMACPP
from hangwatch.model.isolate import EditKind
from hangwatch.model.samples import ProbeMarks
from hangwatch.model.vocabulary import Cause

SERVER_LOG = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp" / "server-0.3.36.log"
LINES = SERVER_LOG.read_text(encoding="utf-8").splitlines()
READY = "INFO:     Uvicorn running on http://127.0.0.1:18123 (Press CTRL+C to quit)"
CMD = ["python", "-m", "llama_cpp.server", "--model", "/m/tiny.gguf"]


def test_the_fixture_is_the_real_run():
    assert LINES[0].startswith("llama_model_loader: loaded meta data with 22 key-value pairs and 21 tensors")
    assert READY in LINES


def test_a_real_boot_opens_the_phases_in_order_and_ends_ready():
    scanner = LogScanner(LLAMACPP)
    tracker = PhaseTracker(LLAMACPP)
    opened: list[tuple[str, str]] = []
    ready_at = None
    for i, line in enumerate(LINES):
        sample = scanner.scan((line,), len(line), float(i))
        for event in sample.phase_events:
            tracker.observe(event)
            opened.append((event.phase, line))
        if sample.ready_line and ready_at is None:
            ready_at = i
    assert [s.name for s in tracker.spans()] == [
        "process_start",
        "metadata",
        "weights",
        "context",
        "http_starting",
    ]
    # Which lines open them: one each for llama.cpp's steps, uvicorn's three before it listens.
    assert opened == [
        ("metadata", LINES[0]),
        ("weights", next(x for x in LINES if x.startswith("load_tensors: loading model tensors"))),
        ("context", "llama_context: constructing llama_context"),
        ("http_starting", "INFO:     Started server process [2270]"),
        ("http_starting", "INFO:     Waiting for application startup."),
        ("http_starting", "INFO:     Application startup complete."),
    ]
    assert ready_at is not None and LINES[ready_at] == READY


def test_no_line_after_ready_opens_a_phase():
    # Requests (llama_perf_context_print, Llama.generate, access lines) and the shutdown are no boot phases.
    scanner = LogScanner(LLAMACPP)
    after = LINES[LINES.index(READY) + 1 :]
    assert after and not any(scanner.scan((line,), len(line), 0.0).phase_events for line in after)


def test_access_lines_of_hangwatchs_own_requests_are_echoes_and_a_clients_are_progress():
    # The probe asks /v1/models (the profile's health path); its access line is recognised by the request.
    scanner = LogScanner(LLAMACPP)
    marks = ProbeMarks(echo_markers=('"GET /v1/models HTTP',))
    probe = 'INFO:     127.0.0.1:49922 - "GET /v1/models HTTP/1.1" 200 OK'
    client = 'INFO:     127.0.0.1:49984 - "POST /v1/completions HTTP/1.1" 200 OK'
    assert probe in LINES and client in LINES
    assert scanner.scan((probe,), len(probe), 1.0, marks=marks).echo_lines == 1
    assert scanner.scan((client,), len(client), 2.0, marks=marks).progress_lines == 1


@pytest.mark.parametrize(
    ("cmdline", "name"),
    [
        (CMD, "llamacpp"),
        (["/venv/bin/python3", "-m", "llama_cpp.server", "--config_file", "c.json"], "llamacpp"),
        (["uvicorn", "--factory", "llama_cpp.server.app:create_app"], "llamacpp"),
        (["python", "-m", "llama_cpp_server_wrapper"], "generic"),
        (["python", "-m", "vllm.entrypoints.openai.api_server"], "vllm"),
        (["python3", "-m", "sglang.launch_server", "--model-path", "m"], "sglang"),
    ],
)
def test_detection_from_the_command_line(cmdline, name):
    assert engines.detect(cmdline).name == name


def test_recognised_from_its_loader_line_behind_a_wrapper():
    assert engines.recognise_log(LINES[0]) == "llamacpp"
    assert engines.recognise_log("llama_context: constructing llama_context") == "llamacpp"


def test_one_process_is_the_server_and_nothing_else_has_a_role():
    assert LLAMACPP.role_of("python", tuple(CMD), True, {}) == ("server", None)
    # Its threads are no processes; a child it might start (a shell-out) is no rank.
    assert LLAMACPP.role_of("python", ("sh", "-c", "x"), False, {"RANK": "1"}) == (None, None)


def test_readiness_is_the_uvicorn_line_or_v1_models_on_its_port():
    assert engines.by_name("llamacpp") is LLAMACPP
    assert LLAMACPP.health_url(CMD) == "http://127.0.0.1:8000/v1/models"
    assert (
        LLAMACPP.health_url([*CMD, "--host", "0.0.0.0", "--port", "9001"])
        == "http://127.0.0.1:9001/v1/models"
    )
    assert LogScanner(LLAMACPP).scan((READY,), len(READY), 0.0).ready_line
    assert LLAMACPP.openai_api and LLAMACPP.metrics is None
    assert LLAMACPP.distribution == "llama-cpp-python"


def test_a_load_failure_is_an_exception_finding_led_by_llama_cpps_reason():
    # A truncated GGUF: llama.cpp's own error line, then llama-cpp-python's traceback ending in a ValueError.
    lines = (
        "llama_model_load: error loading model: tensor 'token_embd.weight' data is not within the file bounds, "
        "model is corrupted or incomplete",
        "llama_model_load_from_file_impl: failed to load model",
        "Traceback (most recent call last):",
        '  File "/v/lib/python3.11/site-packages/llama_cpp/_internals.py", line 62, in __init__',
        '    raise ValueError(f"Failed to load model from file: {path_model}")',
        "ValueError: Failed to load model from file: /tmp/trunc.gguf",
    )
    findings = LogScanner(LLAMACPP).scan(lines, 400, 0.0).findings
    # llama.cpp's own reason comes first (the profile's fatal lines): the ValueError names none.
    assert [(f.cause, f.line) for f in findings] == [(Cause.EXCEPTION, lines[i]) for i in (0, 1, 2, 5)]


@pytest.mark.parametrize(
    ("extra", "toggles"),
    [
        ([], []),
        (["--n_gpu_layers", "0"], []),
        (["--n_gpu_layers", "-1"], ["cpu-only"]),
        (["--n_gpu_layers=20"], ["cpu-only"]),
    ],
)
def test_the_cpu_only_toggle_applies_only_where_layers_are_offloaded(extra, toggles):
    got = LLAMACPP.toggles((*CMD, *extra), "0.3.36")
    assert [t.name for t in got] == toggles
    for toggle in got:
        (edit,) = toggle.edits
        assert (edit.kind, edit.name, edit.value) == (EditKind.REPLACE, "--n_gpu_layers", "0")
