"""llama-cpp-python's OpenAI-compatible server (0.3.36): phase lines: docs/engine-facts.md, "llama.cpp".

One process: ``python -m llama_cpp.server --model M.gguf`` loads the model in its main thread (llama.cpp's
loader and context lines, through llama-cpp-python's log callback, on stderr), then starts uvicorn in the
same process. Requests run ``Llama`` in an AnyIO worker thread, where llama.cpp computes (with an OpenMP
worker beside it): threads, not ranks, and no process titles.
"""

from __future__ import annotations

import re

from hangwatch.engines.profile import Profile
from hangwatch.engines.profile import flag_value
from hangwatch.engines.profile import rule
from hangwatch.model.isolate import Edit
from hangwatch.model.isolate import EditKind
from hangwatch.model.isolate import Toggle
from hangwatch.model.vocabulary import Cause

_GPU_LAYERS = "--n_gpu_layers"


def llamacpp_role(
    title: str, cmdline: tuple[str, ...], is_root: bool, env: dict[str, str]
) -> tuple[str | None, str | None]:
    """The launched command is the server; it starts no process of its own (its work runs in threads)."""
    return ("server", None) if is_root else (None, None)


def llamacpp_toggles(argv: tuple[str, ...], version: str | None) -> tuple[Toggle, ...]:
    """What ``hangwatch isolate`` tries: the model on the CPU alone, where layers were offloaded to a GPU
    (llama-cpp-python offloads none by default; -1 means all)."""
    layers = flag_value(argv, _GPU_LAYERS)
    if layers is None or layers.strip() == "0":
        return ()
    return (
        Toggle(
            "cpu-only",
            (Edit(EditKind.REPLACE, _GPU_LAYERS, "0"),),
            "no layer offloaded to a GPU (the CPU backend alone)",
            (Cause.GPU_SPIN, Cause.CUDA_OOM, Cause.EXCEPTION, Cause.UNKNOWN),
        ),
    )


LLAMACPP = Profile(
    name="llamacpp",
    # `python -m llama_cpp.server`, and `uvicorn llama_cpp.server.app:create_app` (its documented variant).
    command_markers=(re.compile(r"(?:^|[\s/=])llama_cpp\.server\b"),),
    phases=(
        # The process logs nothing while it imports (about 0.5 s here); llama.cpp's first line is the
        # loader's, once it has read the GGUF header, then its metadata, vocabulary and hyper-parameters.
        rule(
            "metadata",
            "reading the model's metadata",
            r"llama_model_loader: loaded meta data with",
            r"llama_model_loader: loading additional \d+ GGUFs",
        ),
        # Tensors mapped (or read) and placed on their devices; a large model prints a row of dots.
        rule("weights", "loading tensors", r"\bload_tensors: loading model tensors"),
        # KV cache, compute buffers and graph reservation; then llama-cpp-python reads the chat template.
        rule("context", "creating the context (KV cache, compute buffers)", r"\bllama_context: constructing"),
        # uvicorn starts only once the model is loaded: the port is bound just before "Uvicorn running on".
        rule(
            "http_starting",
            "starting the HTTP server",
            r"\bStarted server process \[\d+\]",
            r"\bWaiting for application startup\.",
            r"\bApplication startup complete\.",
        ),
    ),
    ready_patterns=(re.compile(r"\bUvicorn running on \S+"),),
    # No /health: /v1/models is the cheapest route, and it answers only once the port is bound (the model
    # loaded). It waits on the same lock as the completions, so it also says whether the model is free.
    health_path="/v1/models",
    default_port=8000,
    role_of=llamacpp_role,
    toggles=llamacpp_toggles,
    distribution="llama-cpp-python",
    distributions=("llama-cpp-python",),
    display_name="llama.cpp",
    # llama.cpp says why a model did not load before llama-cpp-python's "ValueError: Failed to load model
    # from file", which names no reason (a truncated GGUF: "... model is corrupted or incomplete").
    fatal_lines=(
        r"\bllama_model_load: error loading model:",
        r"\bllama_model_load_from_file_impl: failed to load",
    ),
    metrics=None,  # no /metrics route (404)
    openai_api=True,
    extra_phase_labels={"ready": "serving"},
)
