"""The bench report as JSON (schema ``hangwatch.bench/1``), serialised from the model, never built by hand."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any

from hangwatch.model.bench import BenchReport

FLOAT_DIGITS = 6  # microseconds for times; ratios and rates keep more than they can honestly claim


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return round(value, FLOAT_DIGITS) if math.isfinite(value) else None
    return value


def bench_to_dict(report: BenchReport) -> dict[str, Any]:
    data: dict[str, Any] = _plain(dataclasses.asdict(report))
    return data


def write_bench_json(report: BenchReport, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(bench_to_dict(report), indent=1, ensure_ascii=False, allow_nan=False) + "\n")
    tmp.replace(path)
