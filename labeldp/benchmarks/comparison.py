"""Every private run against every other, and ``auto`` against the constant predictor and the best fixed choice
in hindsight: the sections a ``labeldp bench utility`` summary ends each dataset with.

Runs of one seed share the split (the same test rows), so any two (mechanism, learner) pairs compare seed by seed;
a win count says in how many of the (ε, seed) pairs the row was strictly better than the column.

``auto`` is held to two numbers (issue 39): its true test loss against the constant predictor's (the training
labels' true mean, or their majority class — for classes the error rate, 1 − accuracy) in **every** seed, and its
mean against the mean of the best fixed (mechanism, learner) at that ε, chosen in hindsight on these very test
labels — a choice no deployment could make.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from labeldp import report
from labeldp.benchmarks.choices import AUTO
from labeldp.benchmarks.learners import Scoring

AUTO_BOUND = 1.02  # auto's loss (error rate) at most this times the constant's, in every seed
AUTO_GAP = 1.05  # and on average within this of the best fixed choice in hindsight


def entries(part: pd.DataFrame) -> list[tuple[str, str]]:
    """Every private (mechanism, model) of the runs, in their order."""
    private = part[part.mechanism != "non-private"]
    return list(dict.fromkeys(zip(private.mechanism, private.model, strict=True)))


def label(entry: tuple[str, str]) -> str:
    mechanism, model = entry
    return mechanism if mechanism == AUTO and model == AUTO else f"{mechanism} ({model})"


def _by_pair(part: pd.DataFrame, scoring: Scoring, entry: tuple[str, str]) -> pd.Series:
    mechanism, model = entry
    rows = part[(part.mechanism == mechanism) & (part.model == model)]
    return rows.set_index(["epsilon", "seed"])[scoring.column].astype(float)


def win_matrix_lines(part: pd.DataFrame, scoring: Scoring) -> list[str]:
    """The paired win counts of every private (mechanism, learner) against every other, over all ε and seeds."""
    pairs = entries(part)
    if len(pairs) < 2:
        return []
    values = {entry: _by_pair(part, scoring, entry) for entry in pairs}

    def cell(row: tuple[str, str], column: tuple[str, str]) -> str:
        if row == column:
            return "—"
        a, b = values[row], values[column]
        common = a.index.intersection(b.index)
        return f"{int(scoring.better(a[common].to_numpy(), b[common].to_numpy()).sum())}/{len(common)}"

    names = [label(entry) for entry in pairs]
    lines = ["Paired wins: the row's test metric strictly better than the column's, in how many of the (ε, seed) "
             "pairs both ran (the same split):", "",
             "| row beats column | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    lines += [f"| {label(row)} | " + " | ".join(cell(row, column) for column in pairs) + " |" for row in pairs]
    return [*lines, ""]


def _losses(values: pd.Series, scoring: Scoring) -> pd.Series:
    """Losses to compare by ratio: the loss itself, or the error rate for accuracy."""
    return 1 - values if scoring.higher_is_better else values


def auto_lines(part: pd.DataFrame, scoring: Scoring, epsilons: Sequence[float]) -> list[str]:
    """auto per ε: its mean, the constant's, the worst seed's ratio to the constant, the best fixed choice in
    hindsight and the ratio of the means; then the verdict against :data:`AUTO_BOUND` and :data:`AUTO_GAP`."""
    autos = [entry for entry in entries(part) if entry[0] == AUTO]
    fixed = [entry for entry in entries(part) if entry[0] != AUTO]
    reference = part[part.mechanism == "non-private"].drop_duplicates("seed").set_index("seed")
    if not autos or reference.empty:
        return []
    constant = _losses(reference["constant_test_loss"].astype(float), scoring)
    lines: list[str] = []
    for entry in autos:
        values = _losses(_by_pair(part, scoring, entry), scoring)
        cells, worst_all, gaps = {}, [], []
        for epsilon in epsilons:
            if epsilon not in values.index.get_level_values(0):
                continue
            mine = values.xs(epsilon, level="epsilon")
            ratio = mine / constant.reindex(mine.index)
            best = min(fixed, key=lambda f: _losses(_by_pair(part, scoring, f), scoring).xs(
                epsilon, level="epsilon").mean(), default=None)
            best_mean = (_losses(_by_pair(part, scoring, best), scoring).xs(epsilon, level="epsilon").mean()
                         if best is not None else np.nan)
            worst_all.append(float(ratio.max()))
            gaps.append(float(mine.mean() / best_mean) if best is not None else np.nan)
            cells[epsilon] = [f"{mine.mean():.4g}", f"{constant.reindex(mine.index).mean():.4g}",
                              f"{ratio.max():.3f}", f"{label(best) if best else '—'}: {best_mean:.4g}",
                              f"{gaps[-1]:.3f}"]
        what = "error rate (1 − accuracy)" if scoring.higher_is_better else "test loss"
        columns = ["auto", "constant", "worst seed auto/constant", "best fixed in hindsight", "auto/best"]
        lines += [f"{label(entry)} against the constant predictor and the best fixed (mechanism, learner), {what} "
                  "(means over seeds):", "",
                  "| ε | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns),
                  *[f"| {e:g} | " + " | ".join(row) + " |" for e, row in cells.items()], ""]
        within = all(w <= AUTO_BOUND for w in worst_all)
        lines.append(f"{label(entry)}: at most {AUTO_BOUND}× the constant's {what} in every seed at every ε: "
                     f"{'yes' if within else 'no'} (worst {max(worst_all):.3f}); mean over ε of auto/best fixed "
                     f"{np.nanmean(gaps):.3f} (goal ≤ {AUTO_GAP}).")
        lines.append("")
    return lines


def choice_lines(part: pd.DataFrame, epsilons: Sequence[float]) -> list[str]:
    """What auto chose, per ε (candidate: seeds), from runs.csv's ``auto_choice``."""
    rows = part[part.mechanism == AUTO]
    if rows.empty or "auto_choice" not in rows:
        return []

    def cell(_: str, epsilon: float) -> str:
        chosen = rows[rows.epsilon == epsilon]["auto_choice"].fillna("—").value_counts()
        return "; ".join(f"{name} ×{count}" for name, count in chosen.items()) or "—"

    return ["What auto chose (training part / learner / regularization, or the constant), seeds per choice:", "",
            *report.epsilon_table(["auto"], epsilons, cell), ""]
