"""The versions every engine's bug template asks for: Python, torch (and its CUDA), the engine, the driver.

Read cheaply, once, at the end of a run: the launched command's own interpreter is asked in a
subprocess that imports nothing but the standard library (``importlib.metadata``; torch's CUDA
version comes from the text of ``torch/version.py``, torch is never imported), about 50 ms; the
NVIDIA driver from ``/proc/driver/nvidia/version``, and the CUDA version the driver supports and
the GPU models from NVML where it is present. Whatever cannot be read is left out, never guessed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from collections import Counter
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path

import hangwatch
from hangwatch.collect.nvml import read_inventory
from hangwatch.collect.pyenv import interpreter_of
from hangwatch.model.doctor import GpuInventory

# In the order a reader looks for them; each a distribution name as pip knows it: torch, the engines'
# own (passed in: the registry's distributions()), then these.
LIBRARIES = (
    "flashinfer-python",
    "flash-attn",
    "xformers",
    "triton",
    "transformers",
    "nvidia-nccl-cu12",
    "nvidia-nccl-cu13",
)


def distributions_with(engines: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(("torch", *engines, *LIBRARIES)))


_MARKER = "HANGWATCH-VERSIONS "
NVML_WAIT_S = 3.0
# Runs inside the server's interpreter (any Python >= 3.8): the standard library only, nothing imported
# from the environment. The distribution names come as one JSON argument.
SCRIPT = r"""
import json, os, re, sys
out = {"python": sys.version.split()[0]}
try:
    import importlib.metadata as md
    for name in json.loads(sys.argv[1]):
        try:
            out[name] = md.version(name)
        except Exception:
            pass
except ImportError:
    pass
try:
    import importlib.util
    spec = importlib.util.find_spec("torch")
    for root in (spec.submodule_search_locations or []) if spec else []:
        with open(os.path.join(root, "version.py")) as f:
            m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", f.read(), re.M)
        if m:
            out["torch_cuda"] = m.group(1)
        break
except Exception:
    pass
sys.stdout.write("\n" + __MARKER__ + json.dumps(out) + "\n")
""".replace("__MARKER__", repr(_MARKER))

_DRIVER = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")

Runner = Callable[[list[str], float], str | None]


def _run(argv: list[str], timeout_s: float) -> str | None:
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, check=False, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout


def python_versions(
    python: str,
    distributions: Sequence[str],
    run: Runner = _run,
    timeout_s: float = 10.0,
) -> dict[str, str]:
    """{"python": ..., distribution: version, "torch_cuda": ...} as ``python`` sees its environment;
    ``distributions``: what to ask for (``distributions_with`` the engines' packages)."""
    out = run([python, "-c", SCRIPT, json.dumps(list(distributions))], timeout_s)
    for line in reversed((out or "").splitlines()):
        if line.startswith(_MARKER):
            try:
                data = json.loads(line[len(_MARKER) :])
            except ValueError:
                return {}
            if not isinstance(data, dict):
                return {}
            return {str(k): v for k, v in data.items() if isinstance(v, str)}
    return {}


def driver_version(proc_root: Path = Path("/proc")) -> str | None:
    """The NVIDIA kernel module's version ("570.86.15"), from /proc/driver/nvidia/version."""
    try:
        text = (proc_root / "driver" / "nvidia" / "version").read_text(errors="replace")
    except OSError:
        return None
    m = _DRIVER.search(text)
    return m.group(1) if m else None


def gpu_models(inventory: GpuInventory) -> str | None:
    """``8x NVIDIA H200`` (and ``, 1x ...`` for a mixed machine)."""
    names = Counter(g.name for g in inventory.gpus)
    return ", ".join(f"{n}x {name}" for name, n in names.items()) or None


def _bounded(inventory: Callable[[], GpuInventory], wait_s: float) -> GpuInventory:
    """NVML in a thread: a driver that stops answering (a wedged GPU) must not cost the report."""
    got: list[GpuInventory] = []
    thread = threading.Thread(target=lambda: got.append(inventory()), name="hangwatch-versions", daemon=True)
    thread.start()
    thread.join(wait_s)
    return got[0] if got else GpuInventory(unavailable=f"NVML did not answer within {wait_s:g} s")


def environment_versions(
    command: tuple[str, ...],
    *,
    engines: Sequence[str],
    python: str | None = None,
    run: Runner = _run,
    inventory: Callable[[], GpuInventory] = read_inventory,
    proc_root: Path = Path("/proc"),
) -> dict[str, str]:
    """Every version that could be read, under the names a bug template uses, in a fixed order.
    ``engines``: the engines' packages (the registry's distributions())."""
    python = python or interpreter_of(command)
    wanted = distributions_with(engines)
    found = python_versions(python, wanted, run) if python else {}
    env: dict[str, str] = {}
    if "python" in found:
        env["Python"] = found["python"]
    for name in wanted:
        if name in found:
            env[name] = found[name]
            if name == "torch" and "torch_cuda" in found:
                env["torch CUDA"] = found["torch_cuda"]
    driver = driver_version(proc_root)
    gpus = _bounded(inventory, NVML_WAIT_S)
    driver = driver or gpus.driver_version
    if driver:
        env["NVIDIA driver"] = driver
    if gpus.cuda_driver_version:
        env["CUDA (driver)"] = "{}.{}".format(*gpus.cuda_driver_version)
    models = gpu_models(gpus)
    if models:
        env["GPUs"] = models
    env["hangwatch"] = hangwatch.__version__
    env["OS"] = f"{os.uname().sysname} {os.uname().release} {os.uname().machine}"
    return env
