"""Charts as server-side SVG: no script, no network; colours come from classes in console.css, so
the light and dark themes both apply. Every chart has labelled axes with units and a <title>."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 720, 320
LEFT, RIGHT, TOP, BOTTOM = 72, 16, 16, 56


@dataclass(frozen=True)
class Interval:
    """One bucket: its estimate, 95 % interval and simultaneous interval."""

    label: str
    estimate: float
    low: float
    high: float
    sim_low: float
    sim_high: float


def ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high] (1, 2 or 5 times a power of ten apart)."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return [low]
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    return [first + i * step for i in range(math.ceil((high - first) / step) + 1)]


def _fmt(value: float) -> str:
    """A tick label: no trailing noise."""
    return f"{value:.6g}"


class _Frame:
    """Maps data to pixels inside the plot area, and draws the axes."""

    def __init__(self, x_range: tuple[float, float], y_range: tuple[float, float]) -> None:
        self.x0, self.x1 = x_range
        self.yt = ticks(*y_range)
        self.y0, self.y1 = min(self.yt[0], y_range[0]), max(self.yt[-1], y_range[1])
        if self.y1 <= self.y0:
            self.y1 = self.y0 + 1.0

    def x(self, value: float) -> float:
        """Pixel column of ``value``."""
        span = (self.x1 - self.x0) or 1.0
        return LEFT + (value - self.x0) / span * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        """Pixel row of ``value``."""
        return TOP + (self.y1 - value) / (self.y1 - self.y0) * (HEIGHT - TOP - BOTTOM)

    def axes(self, x_label: str, y_label: str) -> list[str]:
        """The y grid and ticks, both axes and their labels."""
        bottom, parts = HEIGHT - BOTTOM, []
        for t in self.yt:
            y = f"{self.y(t):.1f}"
            parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y}" y2="{y}"/>')
            parts.append(f'<text class="tick" x="{LEFT - 6}" y="{y}" text-anchor="end">{_fmt(t)}</text>')
        parts.append(f'<line class="axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{bottom}" y2="{bottom}"/>')
        parts.append(f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{bottom}"/>')
        parts.append(
            f'<text class="label" x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 8}"'
            f' text-anchor="middle">{escape(x_label)}</text>'
        )
        mid = (TOP + bottom) / 2
        parts.append(
            f'<text class="label" x="14" y="{mid}" text-anchor="middle"'
            f' transform="rotate(-90 14 {mid})">{escape(y_label)}</text>'
        )
        return parts


def _svg(title: str, parts: Sequence[str]) -> str:
    """The <svg> element, scalable, with an accessible title."""
    return (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}"'
        f' xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>{"".join(parts)}</svg>'
    )


def interval_chart(rows: Sequence[Interval], title: str, y_label: str) -> str:
    """Estimates as dots with the 95 % interval (thick) and the simultaneous one (thin, wider)."""
    if not rows:
        return _svg(title, ['<text class="label" x="20" y="40">no buckets</text>'])
    finite = [v for r in rows for v in (r.estimate, r.sim_low, r.sim_high, 0.0) if math.isfinite(v)]
    frame = _Frame((-0.5, len(rows) - 0.5), (min(finite), max(finite)))
    parts = frame.axes("bucket", y_label)
    for i, row in enumerate(rows):
        x = frame.x(i)
        parts.append(
            f'<line class="ci-sim" x1="{x:.1f}" x2="{x:.1f}" y1="{frame.y(row.sim_low):.1f}"'
            f' y2="{frame.y(row.sim_high):.1f}"/>'
        )
        parts.append(
            f'<line class="ci" x1="{x:.1f}" x2="{x:.1f}" y1="{frame.y(row.low):.1f}"'
            f' y2="{frame.y(row.high):.1f}"/>'
        )
        parts.append(f'<circle class="est" cx="{x:.1f}" cy="{frame.y(row.estimate):.1f}" r="4"/>')
        parts.append(
            f'<text class="tick" x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">'
            f"{escape(row.label[:16])}</text>"
        )
    return _svg(title, parts)


def line_chart(
    series: dict[str, Sequence[tuple[float, float]]], title: str, x_label: str, y_label: str
) -> str:
    """One polyline with dots per series (x ascending), a legend, x ticks at the data's x values."""
    points = [p for line in series.values() for p in line if math.isfinite(p[1])]
    if not points:
        return _svg(title, ['<text class="label" x="20" y="40">no feasible point</text>'])
    xs = sorted({p[0] for p in points})
    frame = _Frame(
        (xs[0] - 0.05 * (xs[-1] - xs[0] or 1), xs[-1] + 0.05 * (xs[-1] - xs[0] or 1)),
        (0.0, max(p[1] for p in points)),
    )
    parts = frame.axes(x_label, y_label)
    for x in xs:
        parts.append(
            f'<text class="tick" x="{frame.x(x):.1f}" y="{HEIGHT - BOTTOM + 16}"'
            f' text-anchor="middle">{_fmt(x)}</text>'
        )
    for index, (name, line) in enumerate(series.items()):
        cls = f"s{index % 6}"
        coords = " ".join(f"{frame.x(x):.1f},{frame.y(y):.1f}" for x, y in line if math.isfinite(y))
        parts.append(f'<polyline class="line {cls}" points="{coords}"/>')
        for x, y in line:
            if math.isfinite(y):
                parts.append(f'<circle class="dot {cls}" cx="{frame.x(x):.1f}" cy="{frame.y(y):.1f}" r="3"/>')
        parts.append(
            f'<text class="legend {cls}" x="{WIDTH - RIGHT - 8}" y="{TOP + 14 * (index + 1)}"'
            f' text-anchor="end">{escape(name)}</text>'
        )
    return _svg(title, parts)
