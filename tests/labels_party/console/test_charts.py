"""Server-side SVG charts (labels_party/http/console/charts.py): bounded, escaped, no script or style attribute."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import numpy as np

from labels_party.http.console import charts

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _clean(svg: str) -> None:
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert "<script" not in svg and "style=" not in svg and "href" not in svg


def test_budget_bar_fills_the_spent_share_and_clips():
    svg = charts.budget_bar(1.5, 3.0, width=200)
    _clean(svg)
    assert 'width="100.0"' in svg and "ε spent 1.5 of 3" in svg
    assert 'width="200.0"' in charts.budget_bar(5.0, 3.0, width=200)  # a sum of charges can exceed the total
    assert 'width="0.0"' in charts.budget_bar(0.0, 0.0, width=200)


def test_step_chart_has_a_point_per_release_and_the_total():
    points = [(T0, 0.0), (T0 + timedelta(minutes=1), 1.0), (T0 + timedelta(minutes=3), 1.5)]
    svg = charts.step_chart(points, 3.0)
    _clean(svg)
    assert svg.count("<circle") == 3 and 'stroke-dasharray="4 3"' in svg
    assert "2026-01-01 00:00:00" in svg and "2026-01-01 00:03:00" in svg
    same_time = charts.step_chart([(T0, 0.0), (T0, 1.0)], 3.0)  # no time span: spread by order
    assert same_time.count("<circle") == 2 and "nan" not in same_time
    assert "no releases yet" in charts.step_chart([], 3.0)


def test_bar_chart_and_heatmap_are_bounded_by_their_input():
    svg = charts.bar_chart([3, 0, 5], labels=("ε 0", "ε 3"))
    _clean(svg)
    assert svg.count("<rect") == 3
    heat = charts.heatmap(np.eye(4) * 0.5 + 0.125, rows=("1", "4"), columns=("a", "d"), title="heat")
    _clean(heat)
    assert heat.count("<rect") == 16
    assert heat.count('fill="rgb(0,0,255)"') == 4  # the darkest entries
    assert re.search(r"darkest = 0.625", heat)


def test_text_is_escaped():
    svg = charts.heatmap(np.ones((1, 1)), rows=("<b>", "&"), columns=('"x"', "y"), title="<script>")
    assert "<b>" not in svg and "&lt;b&gt;" in svg and "&amp;" in svg and "&lt;script&gt;" in svg


def test_axis_ticks_are_short_and_readable():
    """Real y-axis maxima (noisy prior counts of a 327k-row table, budgets, probabilities): never Python's
    ``6.19e+05`` that the old 56 px margin cut to ``19e+05``."""
    cases = {618_923.4: "619k", 999_950: "1M", 1_234_567: "1.23M", 327_000_000: "327M", 4.2e12: "4.2T",
             999.95: "1k", 512: "512", 3.0: "3", 0.125: "0.125", 0.001234: "1.2e-3", 0.0: "0", -61_900: "-61.9k"}
    assert {value: charts.tick(value) for value in cases} == cases
    assert all(len(charts.tick(v)) <= 6 for v in np.geomspace(1e-9, 1e22, 300))


def test_the_y_axis_label_fits_left_of_the_axis():
    svg = charts.bar_chart([618_923.4, 12.0, 300_000.0], labels=("first label", "last label"))
    _clean(svg)
    label = re.search(r'<text x="([\d.]+)"[^>]*text-anchor="end"[^>]*>619k</text>', svg)
    assert label is not None and "e+0" not in svg
    axis = float(re.search(r'<line x1="([\d.]+)"', svg).group(1))
    assert float(label.group(1)) == axis - 6 and axis - 6 >= charts.CHAR_WIDTH * len("619k")
    wide = charts.step_chart([(T0, 0.0)], 1_234_567_890.0)  # a long label widens the margin
    assert ">1.23G</text>" in wide
    assert float(re.search(r'<line x1="([\d.]+)"', wide).group(1)) - 6 >= charts.CHAR_WIDTH * len("1.23G")
