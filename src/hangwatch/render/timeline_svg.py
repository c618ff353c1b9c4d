"""The supervision timeline as one inline SVG: panels stacked on a shared time axis.

Panels: startup phases as bands (every label whole); CPU per process (cores); I/O per process; GPU
utilisation and memory utilisation; GPU power and memory used; log lines per second; probe
outcomes, stack captures and the verdict as marks; the last progress and, for a stall, the stall
window across every panel. A process has one colour and dash pattern in every panel, legends are in
rank order, and coinciding lines are drawn a little apart so that none hides another. Every label
is XML-escaped here; the caller embeds the result as markup. No script, no external resource: it
renders offline and in any browser.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from hangwatch.model.report import Report
from hangwatch.model.samples import ProbeOutcome
from hangwatch.model.samples import Tick
from hangwatch.model.vocabulary import State

WIDTH = 1000
LEFT = 150
RIGHT = 20
PANEL_H = 90
GAP = 18
LEGEND_ROW = 11
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
# With the colour, a dash pattern per line, and a small vertical offset: ranks whose lines coincide
# (every rank idle at 0) still show, each in its own colour, side by side.
DASHES = ("", "7 3", "3 2", "10 2 2 2")
OFFSET_PX = 2.0
OTHERS_COLOR = "#999"
PHASE_COLORS = ("#dbe9f6", "#fde6cf", "#dcf0d8", "#f6d8d8", "#e7def2", "#efe3dc", "#f7ddee", "#d6f1f4")
PROBE_COLORS = {ProbeOutcome.REFUSED: "#999", ProbeOutcome.TIMEOUT: "#d62728", ProbeOutcome.ERROR: "#ff7f0e"}
MAX_LINES = 12  # per panel; the rest are summed into "others"
CHAR_PX = 6.2  # an estimate of one character of the 10-11 px labels, to keep labels whole
_RANK_PARTS = re.compile(r"(\d+)")


@dataclass(frozen=True)
class Line:
    label: str
    points: tuple[tuple[float, float], ...]
    style: int = 0  # colour and dash: fixed per process (or GPU) for the whole report
    dashed: bool = False  # a second series of the same thing (a GPU's memory utilisation)
    color: str | None = None  # overrides the style's colour ("others")


def _x(t: float, end: float) -> float:
    return LEFT + (WIDTH - LEFT - RIGHT) * (t / end if end > 0 else 0.0)


def _text(x: float, y: float, text: str, cls: str = "", anchor: str = "start") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{attr}>{escape(text)}</text>'


def _stroke(line: Line) -> tuple[str, str]:
    color = line.color or COLORS[line.style % len(COLORS)]
    dash = "4 2" if line.dashed else DASHES[line.style % len(DASHES)]
    return color, (f' stroke-dasharray="{dash}"' if dash else "")


def panel_height(lines: Sequence[Line]) -> float:
    return max(PANEL_H, 40 + LEGEND_ROW * len(lines))


def _panel(
    top: float, title: str, unit: str, lines: Sequence[Line], end: float, *, ceiling: float | None = None
) -> str:
    height = panel_height(lines)
    peak = ceiling if ceiling is not None else max((v for ln in lines for _, v in ln.points), default=0.0)
    peak = peak if peak > 0 else 1.0
    out = [f'<rect x="{LEFT}" y="{top}" width="{WIDTH - LEFT - RIGHT}" height="{height}" class="panel"/>']
    out.append(_text(LEFT - 8, top + 14, title, "title", "end"))
    out.append(_text(LEFT - 8, top + 28, f"max {peak:.3g} {unit}", "muted", "end"))
    bottom = top + height - 2
    for i, line in enumerate(lines):
        color, dash = _stroke(line)
        lift = OFFSET_PX * i  # coinciding lines side by side, never one hidden under another
        path = " ".join(
            f"{'M' if j == 0 else 'L'}{_x(t, end):.1f},"
            f"{bottom - lift - (height - 4 - OFFSET_PX * len(lines)) * min(v / peak, 1.0):.1f}"
            for j, (t, v) in enumerate(line.points)
        )
        if path:
            out.append(
                f'<path d="{path}" stroke="{color}"{dash} class="line">'
                f"<title>{escape(line.label)}</title></path>"
            )
        y = top + 40 + LEGEND_ROW * i
        out.append(
            f'<line x1="{LEFT - 142}" y1="{y - 3}" x2="{LEFT - 128}" y2="{y - 3}" stroke="{color}"{dash} '
            'class="key"/>' + _text(LEFT - 124, y, line.label[:21], "legend")
        )
    if not lines:
        out.append(_text(LEFT + 8, top + height / 2, "no data", "muted"))
    return "\n".join(out)


def rank_key(rank: str | None) -> tuple[object, ...]:
    """TP0 < TP1 < TP2 < TP10 < rank3 (numbers compared as numbers); a process without a rank sorts last."""
    if not rank:
        return (1,)
    return (0, *((0, int(p)) if p.isdigit() else (1, p) for p in _RANK_PARTS.split(rank) if p))


def process_order(ticks: Sequence[Tick]) -> dict[int, int]:
    """pid -> its place for the whole report: ranks in rank order, then the others as they appeared.
    A process keeps its colour and dash in every panel and its place in every legend."""
    seen: dict[int, tuple[tuple[object, ...], int]] = {}
    for tick in ticks:
        for p in tick.processes:
            if p.pid not in seen or (p.rank and seen[p.pid][0] == (1,)):
                seen[p.pid] = (rank_key(p.rank), len(seen) if p.pid not in seen else seen[p.pid][1])
    ordered = sorted(seen, key=lambda pid: seen[pid])
    return {pid: i for i, pid in enumerate(ordered)}


def _per_process(ticks: Sequence[Tick], value: str, order: dict[int, int]) -> list[Line]:
    series: dict[int, list[tuple[float, float]]] = {}
    names: dict[int, str] = {}
    ranked: set[int] = set()
    prev_t: float | None = None
    for tick in ticks:
        dt = max(tick.t - prev_t, 1e-3) if prev_t is not None else 1.0
        prev_t = tick.t
        for p in tick.processes:
            v = p.cpu_delta_s / dt if value == "cpu" else p.io_delta_bytes / dt / (1024 * 1024)
            series.setdefault(p.pid, []).append((tick.t, v))
            names[p.pid] = f"{p.rank} [{p.pid}]" if p.rank else f"{p.name} [{p.pid}]"
            if p.rank:
                ranked.add(p.pid)
    if value == "io":  # a process that never did I/O says nothing here; every rank still shows in CPU
        series = {pid: pts for pid, pts in series.items() if any(v > 0 for _, v in pts)}
    pids = sorted(series, key=lambda pid: order.get(pid, len(order)))
    if len(pids) <= MAX_LINES:
        return [Line(names[pid], tuple(series[pid]), order.get(pid, 0)) for pid in pids]
    # Every rank first (in rank order), then the busiest others; the rest summed into one line.
    busiest = sorted(
        (pid for pid in pids if pid not in ranked), key=lambda pid: -sum(v for _, v in series[pid])
    )
    keep = set(([pid for pid in pids if pid in ranked] + busiest)[: MAX_LINES - 1])
    rest = [pid for pid in pids if pid not in keep]
    summed: dict[float, float] = {}
    for pid in rest:
        for t, v in series[pid]:
            summed[t] = summed.get(t, 0.0) + v
    lines = [Line(names[pid], tuple(series[pid]), order.get(pid, 0)) for pid in pids if pid in keep]
    return [*lines, Line(f"others ({len(rest)})", tuple(sorted(summed.items())), color=OTHERS_COLOR)]


def _gpu_lines(ticks: Sequence[Tick], field: str, label: str = "", scale: float = 1.0) -> list[Line]:
    series: dict[int, list[tuple[float, float]]] = {}
    for tick in ticks:
        if tick.gpu is None:
            continue
        for g in tick.gpu.gpus:
            v = getattr(g, field)
            if v is not None:
                series.setdefault(g.index, []).append((tick.t, float(v) * scale))
    return [
        Line(f"GPU {i}{label}", tuple(pts), style=i, dashed=field == "mem_util_pct")
        for i, pts in sorted(series.items())
    ]


def _gpu_util(ticks: Sequence[Tick]) -> list[Line]:
    """Each GPU's utilisation, and its memory utilisation beside it in the same colour, dashed."""
    util = {line.style: line for line in _gpu_lines(ticks, "util_pct", " util")}
    mem = {line.style: line for line in _gpu_lines(ticks, "mem_util_pct", " mem util")}
    return [line for i in sorted(util.keys() | mem.keys()) for line in (util.get(i), mem.get(i)) if line]


def timeline_svg(report: Report) -> str:
    ticks = report.timeline
    end = max(report.duration_s, ticks[-1].t if ticks else 0.0, 1.0)
    order = process_order(ticks)
    panels: list[str] = []
    top = 52.0
    phases, phases_h = _phases(report, top, end)
    panels.append(phases)
    charts_top = top
    top += phases_h + 10
    charts: list[tuple[str, str, list[Line], float | None]] = [
        ("CPU", "cores", _per_process(ticks, "cpu", order), None),
        ("I/O", "MiB/s", _per_process(ticks, "io", order), None),
    ]
    if any(t.gpu is not None and t.gpu.gpus for t in ticks):
        charts.append(("GPU util", "%", _gpu_util(ticks), 100.0))
        charts.append(("GPU power", "W", _gpu_lines(ticks, "power_w"), None))
        charts.append(("GPU memory", "GiB", _gpu_lines(ticks, "mem_used_bytes", scale=1 / 2**30), None))
    log = Line("log lines/s", tuple((t.t, float(t.log.progress_lines)) for t in ticks))
    charts.append(("log", "lines/s", [log] if ticks else [], None))
    for title, unit, lines, ceiling in charts:
        panels.append(_panel(top, title, unit, lines, end, ceiling=ceiling))
        top += panel_height(lines) + GAP
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
        + _stall_window(report, end, charts_top, top)
        + axis
        + _verdict_line(report, end, height)
        + "</svg>"
    )


def _stall_window(report: Report, end: float, top: float, bottom: float) -> str:
    """The last progress (a line) and, for a stall, the window from it to the verdict (a shaded band)."""
    t = report.last_progress_t
    if t is None:
        return ""
    x = _x(t, end)
    out = []
    quiet = report.duration_s - t
    if report.verdict.state is State.STALLED and quiet > 0:
        after = report.stall_after_s
        rule = ""
        if after:  # a verdict closed early (a lock cycle, a dead peer) came before the rule's time
            rule = (
                f", stall after {after:g} s"
                if quiet >= after - 0.5
                else f", before --stall-after {after:g} s"
            )
        x1 = _x(report.duration_s, end)
        out.append(
            f'<rect x="{x:.1f}" y="{top - 6:.1f}" width="{max(x1 - x, 1):.1f}" '
            f'height="{bottom - top + 6:.1f}" '
            f'class="stall-window"><title>stall window: no progress for {quiet:.1f} s{rule}</title></rect>'
        )
        label = f"no progress {quiet:.0f} s{rule}"
        if x1 - x > len(label) * CHAR_PX + 8:
            out.append(_text((x + x1) / 2, top - 10, label, "stall-label", "middle"))
    out.append(
        f'<line x1="{x:.1f}" y1="{top - 6:.1f}" x2="{x:.1f}" y2="{bottom:.1f}" class="progress-line">'
        f"<title>last progress at {t:.1f} s</title></line>"
        + _text(x - 3, 44, f"last progress {t:.1f} s", "progress-label", "end")
    )
    return "".join(out)


def _phases(report: Report, top: float, end: float) -> tuple[str, float]:
    """The phases as bands, each label whole: inside its band where it fits, else on a row below, each
    row holding labels that do not overlap. Returns the markup and its height."""
    out = [_text(LEFT - 8, top + 16, "phases", "title", "end")]
    rows: list[float] = []  # per row below the bands: where its last label ends
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
        width = len(span.name) * CHAR_PX + 8
        if x1 - x0 >= width:
            out.append(_text(x0 + 4, top + 17, span.name, "band-label"))
            continue
        x = min(x0, WIDTH - RIGHT - width)
        row = next((r for r, last in enumerate(rows) if last < x), len(rows))
        if row == len(rows):
            rows.append(0.0)
        rows[row] = x + width
        y = top + 26 + 12 * (row + 1)
        out.append(
            f'<line x1="{x0 + 0.5:.1f}" y1="{top + 26}" x2="{x0 + 0.5:.1f}" y2="{y - 8}" class="leader"/>'
        )
        out.append(_text(x + 2, y, span.name, "band-label"))
    return "\n".join(out), 26 + 12 * len(rows) + (4 if rows else 0)


def _marks(report: Report, top: float, end: float) -> str:
    out = [
        _text(LEFT - 8, top + 12, "probes", "title", "end"),
        _text(LEFT - 8, top + 32, "stacks", "title", "end"),
    ]
    for probe in report.probes:
        color = (
            "#2ca02c"
            if probe.green
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
        ".verdict-label{fill:#d62728;font-weight:600}.leader{stroke:#999}"
        ".stall-window{fill:#d62728;fill-opacity:0.08}.stall-label{fill:#b22;font-size:10px}"
        ".progress-line{stroke:#2ca02c;stroke-width:1.5;stroke-dasharray:2 2}"
        ".progress-label{fill:#2a7a2a;font-size:10px;font-weight:600}</style>"
    )
