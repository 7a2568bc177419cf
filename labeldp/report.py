"""What the demo and the benchmarks report: Markdown tables of a number per method and ε, and the figure of test
loss (left) and noisy-label loss (right) against ε, one line per mechanism, mean ± sd over seeds
(:func:`labeldp.references.sd`), with the references as horizontal lines: the non-private model and the mean
predictor (:class:`labeldp.references.Yardsticks`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from labeldp.references import sd

# The references' styles, one each: non-private models black, in their own dash patterns; the constant predictor
# (mean or majority class) dotted gray. No mechanism's line is black or gray (LINE_COLORS).
NON_PRIVATE_DASHES = ("--", (0, (6, 2, 1, 2)), (0, (2, 2)), (0, (8, 2, 2, 2, 2, 2)))
CONSTANT_STYLE = {"color": "gray", "linestyle": ":", "linewidth": 2.0}
LINE_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
               "tab:olive", "tab:cyan")
LINE_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
LINE_DASHES = ("-", "--", "-.", ":")


def line_styles(names: Iterable[str]) -> dict[str, dict]:
    """One distinct style per series, in order: a color, a marker and (after the colors run out) a dash pattern,
    so that no two lines of a figure look alike; ``auto`` black and thick, above the others."""
    styles, index = {}, 0
    for name in dict.fromkeys(names):
        if name.split(" ")[0] == "auto":
            styles[name] = {"color": "black", "marker": "*", "markersize": 10, "linewidth": 2.2, "zorder": 5}
            continue
        color = LINE_COLORS[index % len(LINE_COLORS)]
        dash = LINE_DASHES[(index // len(LINE_COLORS)) % len(LINE_DASHES)]
        styles[name] = {"color": color, "marker": LINE_MARKERS[index % len(LINE_MARKERS)], "linestyle": dash}
        index += 1
    return styles


def epsilon_table(methods: Iterable[str], epsilons: Iterable[float], cell: Callable[[str, float], str],
                  header: str = "mechanism") -> list[str]:
    """A Markdown table: one row per method, one column per ε, ``cell(method, ε)`` in each."""
    epsilons = list(epsilons)
    lines = [f"| {header} | " + " | ".join(f"ε={e:g}" for e in epsilons) + " |", "|---|" + "---|" * len(epsilons)]
    return lines + [f"| {m} | " + " | ".join(cell(m, e) for e in epsilons) + " |" for m in methods]


def reference_lines(axis, references: Mapping[str, float]) -> None:
    """Each reference (label → value) as a horizontal line with a legend entry of its own style: the constant
    predictor (a label naming the mean, majority or constant) dotted gray, each non-private model black in a dash
    pattern of its own."""
    dashes = iter(NON_PRIVATE_DASHES * len(references))
    for label, value in references.items():
        constant = any(word in label for word in ("mean", "majority", "constant"))
        style = CONSTANT_STYLE if constant else {"color": "black", "linestyle": next(dashes), "linewidth": 1.4}
        axis.axhline(value, label=label, **style)


def readable_log_ticks(axis, values: np.ndarray) -> None:
    """Labelled ticks on a log y axis whatever its span: 1-2-5 steps, or five geometric ticks rounded to two
    significant digits when fewer than three 1-2-5 steps fall in the data's range (a range within a decade shows
    no number otherwise)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    finite = values[np.isfinite(values) & (values > 0)]
    if finite.size == 0:
        return
    low, high = float(finite.min()), float(finite.max())
    decades = range(int(np.floor(np.log10(low))), int(np.ceil(np.log10(high))) + 1)
    ticks = [m * 10.0**d for d in decades for m in (1, 2, 5) if low <= m * 10.0**d <= high]
    if len(ticks) < 3:
        ticks = sorted({float(f"{t:.2g}") for t in np.geomspace(low, high, 5)})
    axis.yaxis.set_major_locator(FixedLocator(ticks))
    axis.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.yaxis.set_minor_locator(NullLocator())


def _y_scale(axis, values: np.ndarray) -> None:
    """Log where every value is positive; otherwise symmetric log (a relative loss is 0 for the reference)."""
    finite = values[np.isfinite(values)]
    if finite.size and (finite <= 0).any():
        positive = np.abs(finite[finite != 0])
        axis.set_yscale("symlog", linthresh=float(positive.min()) if positive.size else 1.0)
    else:
        axis.set_yscale("log")


def loss_vs_epsilon_figure(runs: pd.DataFrame, *, test: str, noisy: str, test_label: str, title: str,
                           references: Mapping[str, float] | None = None, noisy_label: str = "E ½(ŷ − y)²") -> Any:
    """The figure (matplotlib): ``runs`` has one row per private run with ``mechanism``, ``epsilon`` and the
    ``test`` and ``noisy`` columns; ``references`` (label → value, e.g. :meth:`Yardsticks.plot_lines`) are drawn
    on the test panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    references = dict(references or {})
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = line_styles(runs["mechanism"])
    for mechanism, group in runs.groupby("mechanism", sort=False):
        stats = group.groupby("epsilon")[[test, noisy]].agg(["mean", sd])
        stats = stats.fillna({(column, "sd"): 0.0 for column in (test, noisy)})  # one seed: no error bar
        epsilons = stats.index.to_numpy()
        for axis, column in ((left, test), (right, noisy)):
            if stats[(column, "mean")].notna().any():
                axis.errorbar(epsilons, stats[(column, "mean")], yerr=stats[(column, "sd")], capsize=3,
                              label=mechanism, **styles[mechanism])
    reference_lines(left, references)
    test_values = np.concatenate([runs[test].to_numpy(dtype=float), np.asarray(list(references.values()))])
    _y_scale(left, test_values)
    _y_scale(right, runs[noisy].to_numpy(dtype=float))
    for axis, values in ((left, test_values), (right, runs[noisy].to_numpy(dtype=float))):
        if axis.get_yscale() == "log":
            readable_log_ticks(axis, values)
    left.set(xscale="log", xlabel="ε", ylabel=test_label, title=title)
    right.set(xscale="log", xlabel="ε", ylabel=noisy_label, title="noisy-label loss (train)")
    ticks = sorted(runs["epsilon"].unique())
    for axis in (left, right):
        axis.set_xticks(ticks, [f"{e:g}" for e in ticks])
        axis.minorticks_off()
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    return figure


def loss_vs_epsilon(runs: pd.DataFrame, path: Path, **options) -> None:
    """:func:`loss_vs_epsilon_figure` saved as a PNG."""
    import matplotlib.pyplot as plt

    figure = loss_vs_epsilon_figure(runs, **options)
    figure.savefig(path, dpi=110)
    plt.close(figure)
