"""The bench report as one self-contained HTML file: tables and inline SVG plots, nothing fetched.

Plots: throughput per round (did every round agree?), latency distributions (TTFT, ITL, E2E as
quantile curves), and acceptance per draft position (where a speculator stops being right).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jinja2 import Environment
from jinja2 import PackageLoader
from jinja2 import select_autoescape
from markupsafe import Markup

from hangwatch.model.bench import CURVE_STEP_PCT
from hangwatch.model.bench import BenchReport
from hangwatch.model.bench import ServerResult
from hangwatch.redact import scrub
from hangwatch.render.bench_text import report_notes
from hangwatch.render.bench_text import server_rows
from hangwatch.render.bench_text import workload_line
from hangwatch.render.files import write_atomically
from hangwatch.render.svgplot import Bars
from hangwatch.render.svgplot import Labels
from hangwatch.render.svgplot import Series
from hangwatch.render.svgplot import bar_chart
from hangwatch.render.svgplot import empty_chart
from hangwatch.render.svgplot import line_chart


def get_environment() -> Environment:
    return Environment(
        loader=PackageLoader("hangwatch", "render/templates"),
        autoescape=select_autoescape(["html", "j2"], default_for_string=True, default=True),
        keep_trailing_newline=True,
    )


def _quantile_series(servers: tuple[ServerResult, ...], attr: str, scale: float) -> list[Series]:
    """Quantile curves up to the 98th percentile: the maximum alone would stretch the axis past the rest."""
    out = []
    for color, s in enumerate(servers):
        curve = getattr(s.distributions, attr)[:-1]
        n = len(curve)
        ys = tuple(float(CURVE_STEP_PCT * i) for i in range(n)) if n > 1 else ()
        out.append(Series(s.label, tuple(v * scale for v in curve) if n > 1 else (), ys, color))
    return out


def latency_charts(report: BenchReport) -> list[str]:
    charts = []
    for attr, title, what in (
        ("ttft_s", "Time to first token", "requests"),
        ("itl_s", "Gap between streamed chunks", "gaps"),
        ("e2e_s", "End-to-end latency", "requests"),
    ):
        series = _quantile_series(report.servers, attr, 1000.0)
        charts.append(
            line_chart(Labels(title + " (to p98)", "milliseconds", f"% of {what} at or below"), series)
        )
    return charts


def throughput_chart(report: BenchReport) -> str:
    rounds = max((len(s.rounds) for s in report.servers), default=0)
    groups = [f"round {i + 1}" for i in range(rounds)]
    series = [
        Bars(s.label, tuple(r.output_tokens_per_s for r in s.rounds), i) for i, s in enumerate(report.servers)
    ]
    return bar_chart(Labels("Output tokens/s per round", "round", "output tokens/s"), groups, series)


def acceptance_chart(report: BenchReport) -> str:
    specced = [(i, s) for i, s in enumerate(report.servers) if s.spec is not None and s.spec.per_position]
    if not specced:
        notes = "; ".join(f"{s.label}: {s.spec_note or 'no per-position figures'}" for s in report.servers)
        return empty_chart("Acceptance per draft position", notes[:110])
    width = max(len(s.spec.per_position) for _, s in specced if s.spec is not None)
    groups = [f"position {i}" for i in range(width)]
    series = [Bars(s.label, s.spec.per_position, i) for i, s in specced if s.spec is not None]
    return bar_chart(
        Labels("Accepted per draft, by position", "draft position", "accepted / drafts"), groups, series
    )


def _summary_rows(report: BenchReport) -> list[dict[str, Any]]:
    """The terminal table's rows, so the two outputs never disagree."""
    columns = [server_rows(s) for s in report.servers]
    return [
        {"name": name, "cells": [col[i][1] for col in columns]}
        for i, (name, _) in enumerate(columns[0] if columns else [])
    ]


def _round_rows(report: BenchReport) -> list[list[str]]:
    rows: list[list[str]] = []
    c = report.comparison
    rounds = max((len(s.rounds) for s in report.servers), default=0)
    for i in range(rounds):
        row = [str(i + 1)]
        first = report.servers[0].rounds[i] if i < len(report.servers[0].rounds) else None
        order = [s.label for s in report.servers if i < len(s.rounds) and s.rounds[i].position == 0]
        row.append(
            " then ".join(order + [s.label for s in report.servers if s.label not in order]) if first else ""
        )
        for s in report.servers:
            row.append(f"{s.rounds[i].output_tokens_per_s:.1f}" if i < len(s.rounds) else "-")
        if c is not None and i < len(c.rounds):
            r = c.rounds[i]
            row += [
                f"{v:.2f}x" if v is not None else "-"
                for v in (r.output_tokens_per_s_ratio, r.ttft_p50_ratio, r.e2e_p50_ratio)
            ]
        rows.append(row)
    return rows


def bench_html(report: BenchReport) -> str:
    env = get_environment()
    c = report.comparison
    return scrub(
        env.get_template("bench.html.j2").render(
            title=" vs ".join(s.url for s in report.servers),
            started_at=report.started_at,
            version=report.hangwatch_version,
            schema=report.schema,
            workload=workload_line(report.workload, len(report.servers)).removeprefix("hangwatch bench: "),
            verdict=c.verdict if c is not None else None,
            outcome=c.outcome.value if c is not None else "",
            servers=report.servers,
            rows=_summary_rows(report),
            round_rows=_round_rows(report),
            compared=c is not None,
            throughput_chart=Markup(throughput_chart(report)),  # noqa: S704 - built by svgplot, which escapes every text
            latency_charts=[Markup(x) for x in latency_charts(report)],  # noqa: S704
            acceptance_chart=Markup(acceptance_chart(report)),  # noqa: S704
            notes=report_notes(report),
        )
    )


def write_bench_html(report: BenchReport, path: Path) -> None:
    write_atomically(path, bench_html(report))
