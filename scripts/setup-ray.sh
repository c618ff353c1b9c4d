#!/usr/bin/env bash
# Build (once) the Ray environment that the Ray transport's tests start a local head from.
#
#   scripts/setup-ray.sh            -> prints the venv's python path as its LAST stdout line
#
# Kept out of .venv: Ray pins its own protobuf/grpcio/aiohttp, and the other tests share .venv.
#   HANGWATCH_RAY_VENV   venv directory   (default: $HOME/.cache/hangwatch/ray-<version>)
#   HANGWATCH_PYTHON     interpreter used to create it (default: python3)
#   HANGWATCH_RAY_WHEELS a directory with a cached Ray wheel, used before the registry (default: /tmp/raywhl)
#
# ray[default] rather than bare ray: the dashboard (state API, traceback endpoint) is the part under test.
# Idempotent: a stamp file written after a verified install makes later runs return at once.
set -euo pipefail

SETUP_NAME="setup-ray"
readonly RAY_VERSION="2.60.0"
# Bump when the install recipe changes, so existing venvs are re-verified instead of trusted.
readonly RECIPE_REV="2"

VENV="${HANGWATCH_RAY_VENV:-${HOME:?HOME is not set}/.cache/hangwatch/ray-${RAY_VERSION}}"
PY="${VENV}/bin/python"
STAMP="${VENV}/.hangwatch-setup-ok"
STAMP_TEXT="ray[default]==${RAY_VERSION} recipe=${RECIPE_REV}"
WHEELS="${HANGWATCH_RAY_WHEELS:-/tmp/raywhl}"

# shellcheck source=lib/setup-venv.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/setup-venv.sh"

exit_if_ready
take_lock
start=${SECONDS}
require_base_python 10 "ray ${RAY_VERSION}"
make_venv HANGWATCH_RAY_VENV

find_links=()
[[ -d "${WHEELS}" ]] && find_links=(--find-links "${WHEELS}")
log "installing ray[default]==${RAY_VERSION}"
"${PY}" -m pip install --progress-bar off "${find_links[@]}" "ray[default]==${RAY_VERSION}" 1>&2 \
    || die "pip install ray[default]==${RAY_VERSION} failed (see pip output above)"

# torch's CPU build, for the gloo group the tests' worker actors join (the version .venv uses).
log "installing torch==2.13.0 (the test actors' gloo group)"
"${PY}" -m pip install --progress-bar off torch==2.13.0 1>&2 || die "pip install torch==2.13.0 failed"

log "verifying imports"
"${PY}" - <<PYEOF 1>&2 || die "the venv at ${VENV} installed but does not import; delete it and re-run"
import importlib.metadata as md
import ray
import ray.dashboard  # noqa: F401  (the dashboard's own dependencies: aiohttp and friends)
import aiohttp  # noqa: F401
import torch.distributed  # noqa: F401
got = md.version("ray")
assert got == "${RAY_VERSION}", f"ray {got} installed, expected ${RAY_VERSION}"
print(f"ray {got}")
PYEOF

finish "${start}"
