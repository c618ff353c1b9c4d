"""The supervision timeline as one inline SVG: panels stacked on a shared time axis.

Panels: startup phases as bands; CPU per process (cores); I/O per process; GPU utilisation and
memory utilisation; GPU power and memory used; log lines per second; probe outcomes, stack
captures and the verdict as marks. Every label is XML-escaped here; the caller embeds the result
as markup. No script, no external resource: it renders offline and in any browser.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from hangwatch.model.report import Report
from hangwatch.model.samples import ProbeOutcome
from hangwatch.model.samples import Tick

WIDTH = 1000
LEFT = 150
RIGHT = 20
PANEL_H = 90
GAP = 18
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
PHASE_COLORS = ("#dbe9f6", "#fde6cf", "#dcf0d8", "#f6d8d8", "#e7def2", "#efe3dc", "#f7ddee", "#d6f1f4")
PROBE_COLORS = {ProbeOutcome.REFUSED: "#999", ProbeOutcome.TIMEOUT: "#d62728", ProbeOutcome.ERROR: "#ff7f0e"}
MAX_LINES = 8  # per panel: the busiest processes; the rest are summed into "others"


@dataclass(frozen=True)
class Line:
    label: str
    points: tuple[tuple[float, float], ...]


def _x(t: float, end: float) -> float:
    return LEFT + (WIDTH - LEFT - RIGHT) * (t / end if end > 0 else 0.0)


def _text(x: float, y: float, text: str, cls: str = "", anchor: str = "start") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{attr}>{escape(text)}</text>'


def _panel(
    top: float, title: str, unit: str, lines: Sequence[Line], end: float, *, ceiling: float | None = None
) -> str:
    peak = ceiling if ceiling is not None else max((v for ln in lines for _, v in ln.points), default=0.0)
    peak = peak if peak > 0 else 1.0
    out = [f'<rect x="{LEFT}" y="{top}" width="{WIDTH - LEFT - RIGHT}" height="{PANEL_H}" class="panel"/>']
    out.append(_text(LEFT - 8, top + 14, title, "title", "end"))
    out.append(_text(LEFT - 8, top + 28, f"max {peak:.3g} {unit}", "muted", "end"))
    for i, line in enumerate(lines[:MAX_LINES]):
        color = COLORS[i % len(COLORS)]
        path = " ".join(
            f"{'M' if j == 0 else 'L'}{_x(t, end):.1f},{top + PANEL_H - PANEL_H * min(v / peak, 1.0):.1f}"
            for j, (t, v) in enumerate(line.points)
        )
        if path:
            out.append(
                f'<path d="{path}" stroke="{color}" class="line"><title>{escape(line.label)}</title></path>'
            )
        out.append(
            f'<rect x="{LEFT - 140}" y="{top + 36 + 11 * i}" width="8" height="8" fill="{color}"/>'
            + _text(LEFT - 128, top + 44 + 11 * i, line.label[:22], "legend")
        )
    if not lines:
        out.append(_text(LEFT + 8, top + PANEL_H / 2, "no data", "muted"))
    return "\n".join(out)


def _per_process(ticks: Sequence[Tick], value: str) -> list[Line]:
    series: dict[int, list[tuple[float, float]]] = {}
    names: dict[int, str] = {}
    prev_t: float | None = None
    for tick in ticks:
        dt = max(tick.t - prev_t, 1e-3) if prev_t is not None else 1.0
        prev_t = tick.t
        for p in tick.processes:
            v = p.cpu_delta_s / dt if value == "cpu" else p.io_delta_bytes / dt / (1024 * 1024)
            series.setdefault(p.pid, []).append((tick.t, v))
            names[p.pid] = f"{p.rank or p.name} [{p.pid}]" if p.rank else f"{p.name} [{p.pid}]"
    ranked = sorted(series, key=lambda pid: -sum(v for _, v in series[pid]))
    return [Line(names[pid], tuple(series[pid])) for pid in ranked if any(v > 0 for _, v in series[pid])]


def _gpu_lines(ticks: Sequence[Tick], field: str, scale: float = 1.0) -> list[Line]:
    series: dict[int, list[tuple[float, float]]] = {}
    for tick in ticks:
        if tick.gpu is None:
            continue
        for g in tick.gpu.gpus:
            v = getattr(g, field)
            if v is not None:
                series.setdefault(g.index, []).append((tick.t, float(v) * scale))
    return [Line(f"GPU {i} {field.replace('_', ' ')}", tuple(pts)) for i, pts in sorted(series.items())]


def timeline_svg(report: Report) -> str:
    ticks = report.timeline
    end = max(report.duration_s, ticks[-1].t if ticks else 0.0, 1.0)
    panels: list[str] = []
    top = 34.0
    panels.append(_phases(report, top, end))
    top += 40
    charts: list[tuple[str, str, list[Line], float | None]] = [
        ("CPU", "cores", _per_process(ticks, "cpu"), None),
        ("I/O", "MiB/s", _per_process(ticks, "io"), None),
    ]
    if any(t.gpu is not None and t.gpu.gpus for t in ticks):
        charts.append(
            ("GPU util", "%", _gpu_lines(ticks, "util_pct") + _gpu_lines(ticks, "mem_util_pct"), 100.0)
        )
        charts.append(("GPU power", "W", _gpu_lines(ticks, "power_w"), None))
        charts.append(("GPU memory", "GiB", _gpu_lines(ticks, "mem_used_bytes", 1 / 2**30), None))
    log = Line("log lines/s", tuple((t.t, float(t.log.progress_lines)) for t in ticks))
    charts.append(("log", "lines/s", [log] if ticks else [], None))
    for title, unit, lines, ceiling in charts:
        panels.append(_panel(top, title, unit, lines, end, ceiling=ceiling))
        top += PANEL_H + GAP
    panels.append(_marks(report, top, end))
    top += 44
    height = top + 24
    axis = _axis(top, end)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" '
        f'viewBox="0 0 {WIDTH} {height:.0f}" role="img" aria-label="supervision timeline">'
        f"{_style()}"
        + _text(LEFT, 18, f"timeline: {len(ticks)} ticks over {end:.0f} s", "title")
        + "\n".join(panels)
        + axis
        + _verdict_line(report, end, height)
        + "</svg>"
    )


def _phases(report: Report, top: float, end: float) -> str:
    out = [_text(LEFT - 8, top + 16, "phases", "title", "end")]
    for i, span in enumerate(report.phases):
        x0 = _x(span.start, end)
        x1 = _x(span.end if span.end is not None else end, end)
        color = PHASE_COLORS[i % len(PHASE_COLORS)]
        label = f"{span.name}: {span.label}" if span.label else span.name
        out.append(
            f'<rect x="{x0:.1f}" y="{top}" width="{max(x1 - x0, 1):.1f}" height="26" fill="{color}" '
            'class="band">'
            f"<title>{escape(label)} ({span.start:.1f}-{(span.end or end):.1f} s)</title></rect>"
        )
        if x1 - x0 > 40:
            out.append(_text(x0 + 4, top + 17, span.name[: int((x1 - x0) / 7)], "band-label"))
    return "\n".join(out)


def _marks(report: Report, top: float, end: float) -> str:
    out = [
        _text(LEFT - 8, top + 12, "probes", "title", "end"),
        _text(LEFT - 8, top + 32, "stacks", "title", "end"),
    ]
    for probe in report.probes:
        color = (
            "#2ca02c"
            if probe.outcome is ProbeOutcome.HTTP and (probe.status or 0) < 300
            else (
                "#ff7f0e" if probe.outcome is ProbeOutcome.HTTP else PROBE_COLORS.get(probe.outcome, "#999")
            )
        )
        out.append(
            f'<circle cx="{_x(probe.t, end):.1f}" cy="{top + 8}" r="3" fill="{color}">'
            f"<title>{probe.t:.1f} s: {escape(probe.describe())}</title></circle>"
        )
    for sample in report.stacks:
        out.append(
            f'<rect x="{_x(sample.t, end) - 2:.1f}" y="{top + 22}" width="4" height="14" fill="#555">'
            f"<title>stacks at {sample.t:.1f} s ({sample.elapsed_s:.2f} s)</title></rect>"
        )
    return "\n".join(out)


def _axis(top: float, end: float) -> str:
    step = next(s for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600, 1e9) if end / s <= 12)
    out = [f'<line x1="{LEFT}" y1="{top}" x2="{WIDTH - RIGHT}" y2="{top}" class="axis"/>']
    t = 0.0
    while t <= end + 1e-6:
        x = _x(t, end)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + 4}" class="axis"/>')
        out.append(_text(x, top + 16, f"{t:.0f} s", "muted", "middle"))
        t += step
    return "\n".join(out)


def _verdict_line(report: Report, end: float, height: float) -> str:
    x = _x(report.duration_s, end)
    v = report.verdict
    return (
        f'<line x1="{x:.1f}" y1="28" x2="{x:.1f}" y2="{height - 24:.0f}" class="verdict-line">'
        f"<title>verdict {escape(v.state.value)} at {report.duration_s:.1f} s</title></line>"
        + _text(min(x, WIDTH - RIGHT - 4), 30, f"verdict: {v.state.value}", "verdict-label", "end")
    )


def _style() -> str:
    return (
        "<style>text{font:11px system-ui,sans-serif;fill:#333}.title{font-weight:600}.muted{fill:#888}"
        ".legend{font-size:10px}.panel{fill:#fafafa;stroke:#ddd}.line{fill:none;stroke-width:1.5}"
        ".axis{stroke:#999}.band{stroke:#fff}.band-label{font-size:10px;fill:#345}"
        ".verdict-line{stroke:#d62728;stroke-dasharray:4 3}"
        ".verdict-label{fill:#d62728;font-weight:600}</style>"
    )
