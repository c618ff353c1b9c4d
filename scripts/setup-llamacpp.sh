#!/usr/bin/env bash
# Build (once) the llama.cpp environment: llama-cpp-python's OpenAI-compatible server, the third engine
# profile's real process (one Python process whose work runs in C++ threads), and the gguf package that
# writes the tests' tiny random-weight model.
#
#   scripts/setup-llamacpp.sh       -> prints the venv's python path as its LAST stdout line
#
#   HANGWATCH_LLAMACPP_VENV  venv directory   (default: $HOME/.cache/hangwatch/llamacpp-<version>)
#   HANGWATCH_PYTHON         interpreter used to create it (default: python3)
#
# PyPI has only llama-cpp-python's source: pip compiles llama.cpp with cmake and gcc (several minutes on two
# cores, once). GGML_NATIVE=OFF so that a cache built on one CPU still runs on another of the same arch.
# Idempotent: a stamp file written after a verified install makes later runs return at once.
set -euo pipefail

SETUP_NAME="setup-llamacpp"
readonly LLAMACPP_VERSION="0.3.36"
readonly GGUF_VERSION="0.19.0"
# Bump when the install recipe changes, so existing venvs are re-verified instead of trusted.
readonly RECIPE_REV="1"

VENV="${HANGWATCH_LLAMACPP_VENV:-${HOME:?HOME is not set}/.cache/hangwatch/llamacpp-${LLAMACPP_VERSION}}"
PY="${VENV}/bin/python"
STAMP="${VENV}/.hangwatch-setup-ok"
STAMP_TEXT="llama-cpp-python[server]==${LLAMACPP_VERSION} gguf==${GGUF_VERSION} recipe=${RECIPE_REV}"

# shellcheck source=lib/setup-venv.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/setup-venv.sh"

exit_if_ready
take_lock
start=${SECONDS}
require_base_python 9 "llama-cpp-python ${LLAMACPP_VERSION}"
make_venv HANGWATCH_LLAMACPP_VENV
command -v cmake >/dev/null 2>&1 || die "cmake not found: llama-cpp-python compiles llama.cpp (apt-get install cmake)"

log "compiling llama-cpp-python[server]==${LLAMACPP_VERSION} (llama.cpp from source, once)"
CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "${PY}" -m pip install --progress-bar off "llama-cpp-python[server]==${LLAMACPP_VERSION}" \
        "gguf==${GGUF_VERSION}" 1>&2 \
    || die "pip install llama-cpp-python[server]==${LLAMACPP_VERSION} failed (see pip output above)"

log "verifying imports"
"${PY}" - <<PYEOF 1>&2 || die "the venv at ${VENV} installed but does not import; delete it and re-run"
import importlib.metadata as md
import gguf  # noqa: F401
import llama_cpp
import llama_cpp.server.app  # noqa: F401  (uvicorn, fastapi, sse-starlette: the server's own deps)
got = md.version("llama-cpp-python")
assert got == "${LLAMACPP_VERSION}", f"llama-cpp-python {got} installed, expected ${LLAMACPP_VERSION}"
print(f"llama-cpp-python {got}, gguf {md.version('gguf')}, system info: {llama_cpp.llama_print_system_info().decode()}")
PYEOF

finish "${start}"
