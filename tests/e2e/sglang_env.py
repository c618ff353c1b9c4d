"""How the end-to-end tests launch a real SGLang 0.5.23 server on its CPU engine (docs/sglang-cpu.md).

The venv comes from scripts/setup-sglang-cpu.sh (fixture ``sglang_python`` in conftest.py); the two
import shims in ``sglang_shims/`` go first on the server's PYTHONPATH; the model is tests/e2e/tiny_model.py's
random Llama, of which ``--load-format dummy`` reads only the config and the tokenizer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

SHIMS = Path(__file__).resolve().with_name("sglang_shims")

# What makes SGLang 0.5.23 boot on a CPU-only machine (all measured, see docs/sglang-cpu.md):
SERVER_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",  # without it --device cpu dies at "Load weight begin" (no module vllm)
    "OMP_NUM_THREADS": "1",  # two cores, shared: one thread per process
    "HF_HUB_OFFLINE": "1",  # no network: fail fast instead of retrying unreachable hosts
    "TRANSFORMERS_OFFLINE": "1",
}
# At --tp 2 each scheduler binds its OpenMP threads to one core; without it the scheduler asserts
# "SGLANG_CPU_OMP_THREADS_BIND is not set" and the launcher kills the tree.
TP2_ENV = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}


def sglang_server_cmd(
    python: Path,
    model: Path,
    port: int,
    *,
    tp: int = 1,
    extra: tuple[str, ...] = (),
    sleep_on_idle: bool = True,
) -> list[str]:
    """``python -m sglang.launch_server`` on the CPU engine, bound to loopback ``port``."""
    cmd = [
        str(python), "-m", "sglang.launch_server",
        "--model-path", str(model),
        "--device", "cpu",
        "--load-format", "dummy",  # random weights: only config.json and the tokenizer are read
        "--max-total-tokens", "4096",  # else the KV cache is sized from free host RAM
        "--host", "127.0.0.1",
        "--port", str(port),
    ]  # fmt: skip
    if sleep_on_idle:
        cmd.append("--sleep-on-idle")  # else an idle scheduler spins at 100 % of a core
    if tp != 1:
        cmd += ["--tp", str(tp)]
    return [*cmd, *extra]


def sglang_server_env(base: Mapping[str, str], *, tp: int = 1) -> dict[str, str]:
    """``base`` plus what the server needs; a developer's own SGLANG_* tuning is not inherited.

    The shims directory goes first on PYTHONPATH so that its ``sitecustomize`` is the one imported (it runs
    the files named in HANGWATCH_EXTRA_SITECUSTOMIZE after itself; see sglang_shims/sitecustomize.py).
    """
    env = {k: v for k, v in base.items() if not k.startswith("SGLANG_")}
    env.update(SERVER_ENV)
    if tp > 1:
        if tp != 2:
            raise ValueError("only --tp 1 and 2 fit this 2-core machine (one core per rank)")
        env.update(TP2_ENV)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SHIMS), env.get("PYTHONPATH", "")) if p)
    return env
