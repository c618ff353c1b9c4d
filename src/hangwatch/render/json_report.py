"""JSON reports, serialised from the model with ``dataclasses.asdict`` (never a dict assembled by hand).

One writer for every report (run/attach, stacks, doctor, cleanup, bench): enums become their values,
floats are rounded to what a reader can use (non-finite ones become null, so the file is always valid
JSON), every string is redacted (``redact.scrub``), and the file is replaced atomically.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any

from hangwatch.redact import scrub
from hangwatch.render.files import write_atomically

RUN_FLOAT_DIGITS = 4  # seconds, percentages and rates of a run: a reader needs no more


def plain(value: Any, float_digits: int = RUN_FLOAT_DIGITS) -> Any:
    """JSON-ready data from what ``dataclasses.asdict`` returns; a float that is not finite becomes null."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): plain(v, float_digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v, float_digits) for v in value]
    if isinstance(value, float):
        return round(value, float_digits) if math.isfinite(value) else None
    if isinstance(value, str):
        return scrub(value)  # every string of every report: log lines, frames, source lines, names
    return value


def report_to_dict(report: Any, float_digits: int = RUN_FLOAT_DIGITS) -> dict[str, Any]:
    """Any report dataclass as a JSON-ready dict."""
    data: dict[str, Any] = plain(dataclasses.asdict(report), float_digits)
    return data


def json_text(data: Any) -> str:
    """The JSON text of data already made plain (``plain``, ``report_to_dict``)."""
    return json.dumps(data, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def write_report(report: Any, path: Path, float_digits: int = RUN_FLOAT_DIGITS) -> None:
    write_atomically(path, json_text(report_to_dict(report, float_digits)))
