"""Shared fixtures. Helpers live in named modules (hwrun, proc_helpers): tests/ is on pytest's pythonpath."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hwrun import Outcome
from hwrun import run_hangwatch


@pytest.fixture
def hw(tmp_path: Path):  # type: ignore[no-untyped-def]
    def _run(*args: str, timeout: float = 120, **kwargs: Any) -> Outcome:
        return run_hangwatch(list(args), tmp_path, timeout=timeout, **kwargs)

    return _run
