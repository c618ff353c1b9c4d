"""The Ray venv the Ray tests start their heads and nodes from (scripts/setup-ray.sh), or a skip saying why."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def ray_python() -> Path:
    env = os.environ.get("HANGWATCH_RAY_PYTHON")
    if env:
        return Path(env)
    if os.environ.get("HANGWATCH_SKIP_RAY"):
        pytest.skip("HANGWATCH_SKIP_RAY is set")
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup-ray.sh")], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        pytest.skip(f"the Ray venv could not be built: {out.stderr.strip().splitlines()[-1:]}")
    py = Path(out.stdout.strip().splitlines()[-1])
    check = subprocess.run([str(py), "-c", "import torch, ray"], capture_output=True, check=False)
    if check.returncode != 0:
        pytest.skip("the Ray venv lacks torch (the gloo actors need it)")
    return py
