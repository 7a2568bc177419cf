"""What the demo and the benchmarks report: Markdown tables of a number per method and ε, and the figure of test
loss (left) and noisy-label loss (right) against ε, one line per mechanism, mean ± sd over seeds, the non-private
model as a dashed line."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd


def epsilon_table(methods: Iterable[str], epsilons: Iterable[float], cell: Callable[[str, float], str],
                  header: str = "mechanism") -> list[str]:
    """A Markdown table: one row per method, one column per ε, ``cell(method, ε)`` in each."""
    epsilons = list(epsilons)
    lines = [f"| {header} | " + " | ".join(f"ε={e:g}" for e in epsilons) + " |", "|---|" + "---|" * len(epsilons)]
    return lines + [f"| {m} | " + " | ".join(cell(m, e) for e in epsilons) + " |" for m in methods]


def loss_vs_epsilon(runs: pd.DataFrame, path: Path, *, test: str, noisy: str, test_label: str, title: str,
                    baseline: float | None = None, noisy_label: str = "E ½(ŷ − y)²") -> None:
    """``runs``: one row per private run with ``mechanism``, ``epsilon`` and the ``test`` and ``noisy`` columns."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mechanism, group in runs.groupby("mechanism", sort=False):
        stats = group.groupby("epsilon")[[test, noisy]].agg(["mean", "std"]).fillna(0)
        epsilons = stats.index.to_numpy()
        for axis, column in ((left, test), (right, noisy)):
            axis.errorbar(epsilons, stats[(column, "mean")], yerr=stats[(column, "std")], marker="o", capsize=3,
                          label=mechanism)
    if baseline is not None:
        left.axhline(baseline, color="black", linestyle="--", label="non-private")
    left.set(xscale="log", yscale="log", xlabel="ε", ylabel=test_label, title=title)
    right.set(xscale="log", yscale="log", xlabel="ε", ylabel=noisy_label, title="noisy-label loss (train)")
    ticks = sorted(runs["epsilon"].unique())
    for axis in (left, right):
        axis.set_xticks(ticks, [f"{e:g}" for e in ticks])
        axis.minorticks_off()
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
