"""Put the Slurm stand-ins (tests/fakes/slurm_standin.py) on PATH as squeue, scontrol and srun."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

STANDIN = Path(__file__).resolve().parent / "fakes" / "slurm_standin.py"


def install(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    jobs: dict[str, dict[str, str]],
    nodes: dict[str, int] | None = None,
    tools: tuple[str, ...] = ("squeue", "scontrol", "srun"),
) -> Path:
    """The stand-ins first on PATH for ``jobs``; ``nodes`` maps node names to emulated nodes' pid 1.
    Returns the call log."""
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in tools:
        wrapper = bin_dir / tool
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN} {tool} "$@"\n')
        wrapper.chmod(0o755)
    log = tmp_path / "slurm.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HW_SLURM_JOBS", json.dumps(jobs))
    monkeypatch.setenv("HW_SLURM_NODES", json.dumps(nodes or {}))
    monkeypatch.setenv("HW_SLURM_LOG", str(log))
    return log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
