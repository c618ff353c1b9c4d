"""The JSON report, serialised from the model (never a dict assembled by hand)."""

from __future__ import annotations

import dataclasses
import json
from enum import Enum
from pathlib import Path
from typing import Any

from hangwatch.model.report import Report


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return round(value, 4)
    return value


def report_to_dict(report: Report) -> dict[str, Any]:
    data: dict[str, Any] = _plain(dataclasses.asdict(report))
    return data


def write_report(report: Report, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report_to_dict(report), indent=1, ensure_ascii=False) + "\n")
    tmp.replace(path)
