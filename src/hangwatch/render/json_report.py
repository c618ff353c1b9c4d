"""JSON reports, serialised from the model with ``dataclasses.asdict`` (never a dict assembled by hand).

One writer for every report (run/attach, stacks, doctor, cleanup): enums become their values, floats
are rounded to what a reader can use, and the file is replaced atomically.
"""

from __future__ import annotations

import dataclasses
import json
from enum import Enum
from pathlib import Path
from typing import Any


def plain(value: Any) -> Any:
    """JSON-ready data from what ``dataclasses.asdict`` returns."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, float):
        return round(value, 4)
    return value


def report_to_dict(report: Any) -> dict[str, Any]:
    """Any report dataclass as a JSON-ready dict."""
    data: dict[str, Any] = plain(dataclasses.asdict(report))
    return data


def write_report(report: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report_to_dict(report), indent=1, ensure_ascii=False) + "\n")
    tmp.replace(path)
