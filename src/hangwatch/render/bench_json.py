"""The bench report as JSON (schema ``hangwatch.bench/1``), serialised from the model by the one writer
of every report (``render.json_report``), with more float digits than a run report keeps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hangwatch.model.bench import BenchReport
from hangwatch.render.json_report import report_to_dict
from hangwatch.render.json_report import write_report

FLOAT_DIGITS = 6  # microseconds for times; ratios and rates keep more than they can honestly claim


def bench_to_dict(report: BenchReport) -> dict[str, Any]:
    return report_to_dict(report, FLOAT_DIGITS)


def write_bench_json(report: BenchReport, path: Path) -> None:
    write_report(report, path, FLOAT_DIGITS)
