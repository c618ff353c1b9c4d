"""Tiny inline-SVG charts (lines and grouped bars) for self-contained HTML reports: no scripts, no files.

Every text that reaches the markup goes through ``html.escape``; callers pass plain strings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

WIDTH = 560
HEIGHT = 300
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 64, 16, 28, 48
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")


@dataclass(frozen=True)
class Series:
    name: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    color: int = 0  # index into PALETTE: keep one colour per server across charts


@dataclass(frozen=True)
class Bars:
    name: str
    values: tuple[float | None, ...]
    color: int = 0


@dataclass(frozen=True)
class Labels:
    title: str
    x: str
    y: str


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 5 x 10^k steps) covering [lo, hi]."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0, 1.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    value = math.floor(lo / step) * step
    ticks = []
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < hi:
        ticks.append(round(value, 12))
    return ticks


def fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 1:
        return f"{v:.3g}"
    return f"{v:.2g}"


class _Frame:
    """Data coordinates to pixels inside the margins."""

    def __init__(self, x_ticks: Sequence[float], y_ticks: Sequence[float], width: int, height: int) -> None:
        self.x0, self.x1 = x_ticks[0], x_ticks[-1]
        self.y0, self.y1 = y_ticks[0], y_ticks[-1]
        self.w, self.h = width, height
        self.base = height - MARGIN_B

    def x(self, v: float) -> float:
        span = (self.x1 - self.x0) or 1.0
        return MARGIN_L + (v - self.x0) / span * (self.w - MARGIN_L - MARGIN_R)

    def y(self, v: float) -> float:
        span = (self.y1 - self.y0) or 1.0
        return self.base - (v - self.y0) / span * (self.h - MARGIN_T - MARGIN_B)


def _axes(f: _Frame, y_ticks: Sequence[float], labels: Labels, x_ticks: Sequence[float] = ()) -> list[str]:
    right = f.w - MARGIN_R
    out = [f'<text x="{MARGIN_L}" y="16" class="title">{escape(labels.title)}</text>']
    for t in y_ticks:
        y = f.y(t)
        out.append(f'<line x1="{MARGIN_L}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        out.append(f'<text x="{MARGIN_L - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(fmt(t))}</text>')
    for t in x_ticks:
        out.append(f'<text x="{f.x(t):.1f}" y="{f.base + 16}" text-anchor="middle">{escape(fmt(t))}</text>')
    mid_y = (MARGIN_T + f.base) / 2
    out += [
        f'<line x1="{MARGIN_L}" x2="{right}" y1="{f.base}" y2="{f.base}" class="axis"/>',
        f'<text x="{(MARGIN_L + right) / 2:.0f}" y="{f.h - 10}" text-anchor="middle">'
        f"{escape(labels.x)}</text>",
        f'<text x="14" y="{mid_y:.0f}" text-anchor="middle" transform="rotate(-90 14 {mid_y:.0f})">'
        f"{escape(labels.y)}</text>",
    ]
    return out


def _legend(entries: Sequence[tuple[str, int]], width: int) -> list[str]:
    """In the top margin, right-aligned, beside the title: it never covers data."""
    out = []
    x = width - MARGIN_R
    for name, color in reversed(entries):
        text = name[:24]
        x -= 26 + 7 * len(text)
        out.append(f'<rect x="{x}" y="7" width="10" height="10" fill="{PALETTE[color % len(PALETTE)]}"/>')
        out.append(f'<text x="{x + 14}" y="16">{escape(text)}</text>')
    return out


def _svg(parts: list[str], width: int, height: int, label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="{escape(label)}">' + "".join(parts) + "</svg>"
    )


def empty_chart(title: str, message: str, width: int = WIDTH, height: int = 120) -> str:
    parts = [
        f'<text x="{MARGIN_L}" y="16" class="title">{escape(title)}</text>',
        f'<text x="{width / 2:.0f}" y="{height / 2:.0f}" text-anchor="middle" class="muted">'
        f"{escape(message)}</text>",
    ]
    return _svg(parts, width, height, title)


def line_chart(labels: Labels, series: Sequence[Series], width: int = WIDTH, height: int = HEIGHT) -> str:
    drawn = [s for s in series if s.xs]
    if not drawn:
        return empty_chart(labels.title, "no data", width)
    xs = [x for s in drawn for x in s.xs]
    ys = [y for s in drawn for y in s.ys]
    x_ticks, y_ticks = nice_ticks(min(xs), max(xs)), nice_ticks(min(0.0, *ys), max(ys))
    f = _Frame(x_ticks, y_ticks, width, height)
    parts = _axes(f, y_ticks, labels, x_ticks)
    for s in series:
        if s.xs:
            points = " ".join(f"{f.x(x):.1f},{f.y(y):.1f}" for x, y in zip(s.xs, s.ys, strict=True))
            color = PALETTE[s.color % len(PALETTE)]
            parts.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="2"/>')
    parts += _legend([(s.name, s.color) for s in series], width)
    return _svg(parts, width, height, labels.title)


def bar_chart(
    labels: Labels,
    groups: Sequence[str],
    series: Sequence[Bars],
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """Grouped bars: one group per entry of ``groups``, one bar per series within it."""
    values = [v for s in series for v in s.values if v is not None]
    if not groups or not values:
        return empty_chart(labels.title, "no data", width)
    y_ticks = nice_ticks(0.0, max(values))
    f = _Frame([0.0, float(len(groups))], y_ticks, width, height)
    parts = _axes(f, y_ticks, labels)
    slot = (width - MARGIN_L - MARGIN_R) / len(groups)
    bar = slot * 0.8 / max(len(series), 1)
    for g, group in enumerate(groups):
        left = MARGIN_L + g * slot + slot * 0.1
        parts.append(
            f'<text x="{left + slot * 0.4:.1f}" y="{f.base + 16}" text-anchor="middle">{escape(group)}</text>'
        )
        for i, s in enumerate(series):
            v = s.values[g] if g < len(s.values) else None
            if v is None:
                continue
            top = f.y(v)
            tip = escape(f"{s.name} {group}: {fmt(v)}")
            parts.append(
                f'<rect x="{left + i * bar:.1f}" y="{top:.1f}" width="{bar * 0.92:.1f}" '
                f'height="{max(0.0, f.base - top):.1f}" fill="{PALETTE[s.color % len(PALETTE)]}">'
                f"<title>{tip}</title></rect>"
            )
    parts += _legend([(s.name, s.color) for s in series], width)
    return _svg(parts, width, height, labels.title)
