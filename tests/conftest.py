"""Shared fixtures. Helpers live in named modules (hwrun, proc_helpers): tests/ is on pytest's pythonpath."""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from cuda_artefacts import build_all
from cuda_artefacts import find_nvcc
from hwrun import Outcome
from hwrun import run_hangwatch


def _terminated(signum: int, frame: FrameType | None) -> None:
    # Python's default for SIGTERM ends the interpreter at once, with no `finally` and no context
    # manager's exit: a suite stopped by an outer `timeout` then left the processes its tests started
    # (seen: two stub servers of the bench tests outlived their run). As an exception, every test's
    # clean-up runs, descendants first, as it does on Ctrl-C.
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)


@pytest.fixture(autouse=True)
def state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """hangwatch's state folder for this test ($XDG_STATE_HOME/hangwatch: run folders, the phase history),
    fresh and temporary: every hangwatch a test starts, in-process or as a subprocess of ``os.environ``,
    keeps its state there, never in the user's ~/.local/state, and one test's boots are not another's
    history. (A folder of its own, not in ``tmp_path``: tests that list ``tmp_path`` find only theirs.)"""
    base = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("XDG_STATE_HOME", str(base))
    return base / "hangwatch"


@pytest.fixture
def hw(tmp_path: Path):  # type: ignore[no-untyped-def]
    def _run(*args: str, timeout: float = 120, **kwargs: Any) -> Outcome:
        return run_hangwatch(list(args), tmp_path, timeout=timeout, **kwargs)

    return _run


@pytest.fixture(scope="session")
def artefacts() -> Path:
    """Real CUDA modules built once per session with nvcc (tests/cuda_artefacts.py); skipped without nvcc."""
    nvcc = find_nvcc()
    if nvcc is None:
        pytest.skip(
            "nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin): cannot build real CUDA modules"
        )
    return build_all(nvcc)
