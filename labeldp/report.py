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

REFERENCE_STYLES = ({"color": "black", "linestyle": "--"}, {"color": "gray", "linestyle": ":"})


def epsilon_table(methods: Iterable[str], epsilons: Iterable[float], cell: Callable[[str, float], str],
                  header: str = "mechanism") -> list[str]:
    """A Markdown table: one row per method, one column per ε, ``cell(method, ε)`` in each."""
    epsilons = list(epsilons)
    lines = [f"| {header} | " + " | ".join(f"ε={e:g}" for e in epsilons) + " |", "|---|" + "---|" * len(epsilons)]
    return lines + [f"| {m} | " + " | ".join(cell(m, e) for e in epsilons) + " |" for m in methods]


def reference_lines(axis, references: Mapping[str, float]) -> None:
    """Each reference (label → value) as a horizontal line with a legend entry (non-private first, dashed black;
    then the mean predictor, dotted gray)."""
    for (label, value), style in zip(references.items(), REFERENCE_STYLES * len(references), strict=False):
        axis.axhline(value, label=label, **style)


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
    for mechanism, group in runs.groupby("mechanism", sort=False):
        stats = group.groupby("epsilon")[[test, noisy]].agg(["mean", sd]).fillna(0)
        epsilons = stats.index.to_numpy()
        for axis, column in ((left, test), (right, noisy)):
            axis.errorbar(epsilons, stats[(column, "mean")], yerr=stats[(column, "sd")], marker="o", capsize=3,
                          label=mechanism)
    reference_lines(left, references)
    _y_scale(left, np.concatenate([runs[test].to_numpy(dtype=float), np.asarray(list(references.values()))]))
    _y_scale(right, runs[noisy].to_numpy(dtype=float))
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
