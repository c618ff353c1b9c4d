#!/usr/bin/env bash
# Build (once) the SGLang environment that the end-to-end tests boot a real SGLang server (CPU engine) from.
#
#   scripts/setup-sglang-cpu.sh          -> prints the venv's python path as its LAST stdout line
#
# The venv lives OUTSIDE the repo (a clean CI clone must not carry 2.6 GB of wheels, and the venv survives
# across clones on the same machine):
#   HANGWATCH_SGLANG_VENV   venv directory   (default: $HOME/.cache/hangwatch/sglang-cpu-0.5.23)
#   HANGWATCH_PYTHON        interpreter used to create it (default: python3; sglang 0.5.23 needs >= 3.11)
#
# `pip install sglang==0.5.23` would pull torch 2.14.1 and several GB of CUDA-only packages. Instead:
#   1. torch==2.13.0 (the CPU wheel these machines carry),
#   2. sglang==0.5.23 and torchvision==0.28.0 with --no-deps,
#   3. the CPU subset of sglang's requirements, every version pinned in sglang-cpu-requirements.txt.
# Two import shims (tests/e2e/sglang_shims: torchvision's CUDA-only meta registrations, and a stand-in
# sgl_kernel) are not installed into the venv: the tests put them on the server's PYTHONPATH, and the
# verification below imports the server's modules through them.
#
# Idempotent: a stamp file written after a verified install makes later runs return at once; it names the
# recipe revision and the requirements file's hash, so a changed recipe re-installs and re-verifies.
# Everything except the final path goes to stderr, so callers can take stdout's last line verbatim.
# Runs unattended (CI: root, no stdin); every failure exits non-zero with a message saying what broke.
set -euo pipefail

SETUP_NAME="setup-sglang-cpu"
readonly SGLANG_VERSION="0.5.23"
readonly TORCH_VERSION="2.13.0"
readonly TORCHVISION_VERSION="0.28.0"
# Bump when the install steps change (a change of the requirements file is caught by its hash).
readonly RECIPE_REV="1"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REQUIREMENTS="${HERE}/sglang-cpu-requirements.txt"
SHIMS="${HERE}/../tests/e2e/sglang_shims"
VENV="${HANGWATCH_SGLANG_VENV:-${HOME:?HOME is not set}/.cache/hangwatch/sglang-cpu-${SGLANG_VERSION}}"
PY="${VENV}/bin/python"
STAMP="${VENV}/.hangwatch-setup-ok"

# shellcheck source=lib/setup-venv.sh
source "${HERE}/lib/setup-venv.sh"

[[ -f "${REQUIREMENTS}" ]] || die "${REQUIREMENTS} is missing"
[[ -f "${SHIMS}/sitecustomize.py" && -f "${SHIMS}/sgl_kernel/__init__.py" ]] || die "shims missing in ${SHIMS}"
REQ_HASH="$(sha256sum "${REQUIREMENTS}" | cut -c1-16)"
STAMP_TEXT="sglang==${SGLANG_VERSION} torch==${TORCH_VERSION} recipe=${RECIPE_REV} requirements=${REQ_HASH}"

exit_if_ready
take_lock
start=${SECONDS}
require_base_python 11 "sglang ${SGLANG_VERSION}"
make_venv HANGWATCH_SGLANG_VENV
rm -f "${STAMP}"  # from here on the venv is not verified, whatever it held before

PIP=("${PY}" -m pip install --progress-bar off)

log "installing torch==${TORCH_VERSION} (CPU)"
"${PIP[@]}" "torch==${TORCH_VERSION}" 1>&2 || die "pip install torch==${TORCH_VERSION} failed (see above)"

# --no-deps: sglang's own requirements pin torch 2.14.1 and CUDA-only kernels; torchvision's would be
# met anyway, but it is installed the same way so that nothing of it can move torch.
log "installing sglang==${SGLANG_VERSION} and torchvision==${TORCHVISION_VERSION} without dependencies"
"${PIP[@]}" --no-deps "sglang==${SGLANG_VERSION}" "torchvision==${TORCHVISION_VERSION}" 1>&2 \
    || die "pip install --no-deps sglang torchvision failed (see above)"

# torch is named again so that the resolver holds it where it is. pip then warns that sglang's
# requirements are not met (the CUDA packages left out on purpose): expected, not an error.
log "installing the CPU subset of sglang's requirements ($(grep -c '==' "${REQUIREMENTS}") pinned packages)"
"${PIP[@]}" "torch==${TORCH_VERSION}" -r "${REQUIREMENTS}" 1>&2 \
    || die "pip install -r ${REQUIREMENTS} failed (see above)"

log "verifying: the server's modules import with the CPU engine and the shims"
SGLANG_USE_CPU_ENGINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 \
PYTHONPATH="${SHIMS}" "${PY}" - <<EOF 1>&2 || die "the venv at ${VENV} installed but does not import; delete it and re-run"
import importlib.metadata as md

import torch
import torchvision
import transformers

# What launch_server, a scheduler and the detokenizer import for a Llama on the CPU engine.
import sglang.launch_server
import sglang.srt.entrypoints.http_server
import sglang.srt.layers.attention.torch_native_backend
import sglang.srt.managers.detokenizer_manager
import sglang.srt.managers.scheduler
import sglang.srt.mem_cache.allocation
import sglang.srt.model_executor.model_runner
import sglang.srt.models.llama
from sglang.srt.utils import is_cpu

for dist, want in (("sglang", "${SGLANG_VERSION}"), ("torchvision", "${TORCHVISION_VERSION}")):
    got = md.version(dist)
    assert got == want, f"{dist} {got} installed, expected {want}"
assert torch.__version__.split("+")[0] == "${TORCH_VERSION}", f"torch {torch.__version__}"
assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build"
assert is_cpu(), "SGLANG_USE_CPU_ENGINE=1 did not select the CPU engine"
print(f"sglang {md.version('sglang')}, torch {torch.__version__}, torchvision {torchvision.__version__}, "
      f"transformers {transformers.__version__}")
EOF

finish "${start}"
