"""Real CUDA extension modules for the fat-binary tests, built with nvcc once and cached.

Each is a tiny shared object with one kernel, compiled for a chosen set of targets, so the tests
read what nvcc really writes (section layout, flags, compression) rather than hand-made bytes.
The cache lives outside the repository (``$HANGWATCH_TEST_CACHE`` or ~/.cache/hangwatch/test-fatbins),
keyed by the nvcc version and the recipes, and is never committed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

KERNEL = r"""
__global__ void add_one(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
extern "C" int launch(float* x, int n) { add_one<<<(n + 255) / 256, 256>>>(x, n); return 0; }
"""

# name -> nvcc target flags
RECIPES: dict[str, list[str]] = {
    "sm90": ["-gencode", "arch=compute_90,code=sm_90"],
    "sm90_ptx": ["-gencode", "arch=compute_90,code=[sm_90,compute_90]"],
    "sm90a": ["-gencode", "arch=compute_90a,code=sm_90a"],
    "sm100a": ["-gencode", "arch=compute_100a,code=sm_100a"],
    "sm100a_ptx": ["-gencode", "arch=compute_100a,code=[sm_100a,compute_100a]"],
    "sm120": ["-gencode", "arch=compute_120,code=sm_120"],
    "sm120_ptx": ["-gencode", "arch=compute_120,code=[sm_120,compute_120]"],
    "ptx90_only": ["-gencode", "arch=compute_90,code=compute_90"],
    "multi": [
        "-gencode",
        "arch=compute_90,code=sm_90",
        "-gencode",
        "arch=compute_100a,code=sm_100a",
        "-gencode",
        "arch=compute_120,code=sm_120",
    ],
    "sm90_compressed": ["-gencode", "arch=compute_90,code=sm_90", "-Xfatbin", "-compress-all"],
    "sm90_rdc": ["-rdc=true", "-gencode", "arch=compute_90,code=sm_90"],
}

# name -> (SASS targets, PTX targets) the runtime loads (.nv_fatbin), as nvcc was asked for
EXPECTED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "sm90": (("sm_90",), ()),
    "sm90_ptx": (("sm_90",), ("compute_90",)),
    "sm90a": (("sm_90a",), ()),
    "sm100a": (("sm_100a",), ()),
    "sm100a_ptx": (("sm_100a",), ("compute_100a",)),
    "sm120": (("sm_120",), ()),
    "sm120_ptx": (("sm_120",), ("compute_120",)),
    "ptx90_only": ((), ("compute_90",)),
    "multi": (("sm_90", "sm_100a", "sm_120"), ()),
    "sm90_compressed": (("sm_90",), ()),
    "sm90_rdc": (("sm_90",), ()),
}

# name -> verdict for a GPU of capability 9.0, 10.0, 12.0
VERDICTS: dict[str, tuple[str, str, str]] = {
    "sm90": ("native", "none", "none"),
    "sm90_ptx": ("native", "jit", "jit"),
    "sm90a": ("native", "none", "none"),
    "sm100a": ("none", "native", "none"),
    "sm100a_ptx": ("none", "native", "none"),
    "sm120": ("none", "none", "native"),
    "sm120_ptx": ("none", "none", "native"),
    "ptx90_only": ("jit", "jit", "jit"),
    "multi": ("native", "native", "native"),
    "sm90_compressed": ("native", "none", "none"),
    "sm90_rdc": ("native", "none", "none"),
}
CAPABILITIES = ("9.0", "10.0", "12.0")


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return None


def build_all(nvcc: str) -> Path:
    """Build every recipe (once per nvcc version and recipe set) and return the folder holding NAME.so."""
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256((version + KERNEL + repr(sorted(RECIPES.items()))).encode()).hexdigest()[:16]
    base = Path(
        os.environ.get("HANGWATCH_TEST_CACHE") or Path.home() / ".cache" / "hangwatch" / "test-fatbins"
    )
    out = base / key
    if (out / ".complete").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    src = out / "kernel.cu"
    src.write_text(KERNEL)
    for name, flags in RECIPES.items():
        target = out / f"{name}.so"
        cmd = [
            nvcc,
            "-shared",
            "-Xcompiler",
            "-fPIC",
            "-cudart",
            "shared",
            *flags,
            str(src),
            "-o",
            str(target),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=out, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc failed for {name}: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    (out / ".complete").write_text(version)
    return out
