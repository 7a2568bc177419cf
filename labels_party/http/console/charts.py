"""Charts as inline SVG, drawn on the server: a budget bar, a step chart over time, a histogram, a bar chart and a
heatmap. Each returns markup whose size is bounded by its arguments' (already bounded) lengths; every text is
escaped and every number formatted, so nothing from the database reaches the page unescaped. No scripts, no style
attributes (the Content-Security-Policy allows neither): colours are SVG presentation attributes."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np
from markupsafe import Markup, escape

INK, GRID, SPENT, REMAINING, TOTAL = "#1f2933", "#cbd2d9", "#c2410c", "#d9e2ec", "#0b6e4f"


def _svg(width: int, height: int, label: str, body: list[str]) -> Markup:
    return Markup(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                  f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}">'
                  f'<title>{escape(label)}</title>{"".join(body)}</svg>')


def _text(x: float, y: float, text: str, *, anchor: str = "start", size: int = 11) -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" fill="{INK}" text-anchor="{anchor}" '
            f'font-family="sans-serif">{escape(text)}</text>')


def number(value: float) -> str:
    """A short human form of ε (the exact values are in the page's text next to the charts)."""
    return f"{value:.4g}"


SI_SUFFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
CHAR_WIDTH = 7  # px: an upper bound of a digit's or letter's advance at font-size 11 (sans-serif)
MIN_LEFT = 56


def tick(value: float) -> str:
    """An axis label of at most 6 characters (and a minus sign): 3 significant digits with an SI suffix from a
    thousand up (619k, 1.23M), plain below (0.125, 42), 2 in a short exponent for tiny or huge values (1.2e-5,
    2.3e20); never Python's ``6.19e+05``."""
    if not np.isfinite(value):
        return str(value)
    rounded = float(f"{value:.3g}")  # rounding first: 999,950 is "1M", not "1e+03k"
    magnitude = abs(rounded)
    if magnitude >= 1e18 or 0 < magnitude < 0.01:
        return _exponent(rounded)
    for scale, suffix in SI_SUFFIXES:
        if magnitude >= scale:
            return f"{rounded / scale:.3g}{suffix}"
    return f"{rounded:.3g}"


def _exponent(value: float) -> str:
    mantissa, exponent = f"{value:.1e}".split("e")  # two significant digits: 1.2e-5, not 1.23e-05
    return f"{float(mantissa):g}e{int(exponent)}"


def _left_margin(*labels: str) -> int:
    """The plot's left edge: room for its longest y-axis label, right-aligned 6 px before the axis."""
    return max(MIN_LEFT, 12 + CHAR_WIDTH * max(len(label) for label in labels))


def budget_bar(spent: float, total: float, *, width: int = 320, height: int = 18, label: str = "") -> Markup:
    """Spent of total as a filled bar (clipped at the end: a sum of charges can exceed a per-example total)."""
    share = 0.0 if total <= 0 else min(1.0, max(0.0, spent / total))
    label = label or f"ε spent {number(spent)} of {number(total)}"
    return _svg(width, height, label, [
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="{REMAINING}"/>',
        f'<rect x="0" y="0" width="{share * width:.1f}" height="{height}" fill="{SPENT}"/>'])


def step_chart(points: Sequence[tuple[datetime, float]], total: float, *, width: int = 640,
               height: int = 220) -> Markup:
    """ε spent (the dataset's maximum over examples) after each release, over time, with the total dashed."""
    left, right, top, bottom = _left_margin(tick(total)), 12, 12, 34
    plot_w, plot_h = width - left - right, height - top - bottom
    body = [f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="{INK}"/>',
            f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="{INK}"/>']
    ceiling = max([total, *(v for _, v in points)]) or 1.0
    y = lambda v: top + plot_h * (1 - v / ceiling)  # noqa: E731
    body.append(f'<line x1="{left}" y1="{y(total):.1f}" x2="{left + plot_w}" y2="{y(total):.1f}" '
                f'stroke="{TOTAL}" stroke-dasharray="4 3"/>')
    body += [_text(left - 6, y(total) + 4, tick(total), anchor="end"),
             _text(left - 6, top + plot_h + 4, "0", anchor="end")]
    if points:
        times = [t.timestamp() for t, _ in points]
        span = times[-1] - times[0]
        xs = ([left + plot_w * (t - times[0]) / span for t in times] if span > 0
              else [left + plot_w * i / max(1, len(points) - 1) for i in range(len(points))])
        path, previous = [], 0.0
        for i, (x, (_, value)) in enumerate(zip(xs, points, strict=True)):
            path.append(f"{'M' if i == 0 else 'L'}{x:.1f},{y(previous):.1f} L{x:.1f},{y(value):.1f}")
            previous = value
        path.append(f"L{left + plot_w:.1f},{y(previous):.1f}")
        body.append(f'<path d="{" ".join(path)}" fill="none" stroke="{SPENT}" stroke-width="2"/>')
        body += [f'<circle cx="{x:.1f}" cy="{y(v):.1f}" r="2.5" fill="{SPENT}"/>' for x, (_, v) in
                 zip(xs, points, strict=True)]
        body += [_text(left, height - 10, points[0][0].strftime("%Y-%m-%d %H:%M:%S")),
                 _text(left + plot_w, height - 10, points[-1][0].strftime("%Y-%m-%d %H:%M:%S"), anchor="end")]
    else:
        body.append(_text(left + plot_w / 2, top + plot_h / 2, "no releases yet", anchor="middle"))
    return _svg(width, height, "ε spent over time (maximum over examples) and the total", body)


def bar_chart(values: Sequence[float], *, labels: tuple[str, str] = ("", ""), width: int = 640, height: int = 180,
              title: str = "", color: str = SPENT) -> Markup:
    """Vertical bars, one per value (the caller bounds their number), with the first and last labels."""
    heights = np.asarray(values, dtype=np.float64)
    highest = float(heights.max()) if heights.size and heights.max() > 0 else 1.0
    left, right, top, bottom = _left_margin(tick(highest)), 12, 12, 30
    plot_w, plot_h = width - left - right, height - top - bottom
    step = plot_w / max(1, heights.size)
    body = [f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="{INK}"/>']
    for i, value in enumerate(heights.tolist()):
        h = plot_h * max(0.0, value) / highest
        body.append(f'<rect x="{left + i * step + 0.5:.1f}" y="{top + plot_h - h:.1f}" '
                    f'width="{max(0.5, step - 1):.1f}" height="{h:.1f}" fill="{color}"/>')
    body += [_text(left - 6, top + 8, tick(highest), anchor="end"), _text(left - 6, top + plot_h + 4, "0",
                                                                          anchor="end"),
             _text(left, height - 10, labels[0]), _text(left + plot_w, height - 10, labels[1], anchor="end")]
    return _svg(width, height, title, body)


def heatmap(matrix: np.ndarray, *, rows: tuple[str, str], columns: tuple[str, str], cell: int = 8,
            title: str = "") -> Markup:
    """One square per entry (the caller downsamples to a bounded shape); darker is more probable (square root of
    the share of the largest entry, so small probabilities stay visible)."""
    matrix = np.asarray(matrix, dtype=np.float64)
    left, top, bottom = 70, 20, 30
    n, m = matrix.shape
    width, height = left + m * cell + 10, top + n * cell + bottom
    highest = float(matrix.max()) if matrix.size and matrix.max() > 0 else 1.0
    shade = np.sqrt(np.clip(matrix / highest, 0.0, 1.0))
    body = []
    for i in range(n):
        for j in range(m):
            level = int(round(255 * (1 - shade[i, j])))
            body.append(f'<rect x="{left + j * cell}" y="{top + i * cell}" width="{cell}" height="{cell}" '
                        f'fill="rgb({level},{level},255)"/>')
    body += [_text(left - 4, top + 9, rows[0], anchor="end", size=10),
             _text(left - 4, top + n * cell, rows[1], anchor="end", size=10),
             _text(left, top - 6, columns[0], size=10),
             _text(left + m * cell, top - 6, columns[1], anchor="end", size=10),
             _text(left, top + n * cell + 16, f"darkest = {number(highest)}", size=10)]
    return _svg(width, height, title, body)
