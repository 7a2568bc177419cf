"""Trees against the MLP on the same privatized labels, and which mechanism wins under each learner: the section a
``labeldp bench utility --model mlp,gbdt`` summary adds per dataset.

Both learners train on the same release of every mechanism × ε × seed (one charge), so their difference is paired
seed by seed: the split, the release and hence the noisy labels are the same, only the learner differs (a
multi-stage protocol such as LP-2ST releases per learner: there only the split is shared). Mechanisms are compared
within a learner by seed as well (the same split, different releases). Every cell states how many seeds agree, so
a mean that one seed carries reads as such.

Learners are compared on the absolute metric (MSE, Poisson loss, accuracy), never on the relative Poisson loss:
that is relative to each learner's own non-private model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from labeldp import report

TREES, NETWORK = "gbdt", "mlp"


@dataclass(frozen=True)
class Scoring:
    """The runs.csv column two models are compared on and its direction."""

    column: str  # test_loss (MSE or Poisson loss) or accuracy
    higher_is_better: bool

    def better(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Per seed: is ``a`` strictly better than ``b``?"""
        return a > b if self.higher_is_better else a < b

    def change(self, a: float, b: float) -> str:
        """``a`` against ``b``: percentage points of accuracy, or the loss's relative change in percent."""
        if self.higher_is_better:
            return f"{100 * (a - b):+.1f} pp"
        return f"{100 * (a / b - 1):+.1f} %"


def scoring_for(classification: bool) -> Scoring:
    return Scoring("accuracy", True) if classification else Scoring("test_loss", False)


def _by_seed(runs: pd.DataFrame, scoring: Scoring, model: str, mechanism: str,
             epsilon: float | None) -> pd.Series:
    rows = runs[(runs.model == model) & (runs.mechanism == mechanism)]
    rows = rows[rows.epsilon.isna()] if epsilon is None else rows[rows.epsilon == epsilon]
    return rows.set_index("seed")[scoring.column].astype(float)


@dataclass(frozen=True)
class Paired:
    """One cell's paired values: ``a`` and ``b`` on the same seeds."""

    a: np.ndarray
    b: np.ndarray

    @classmethod
    def of(cls, a: pd.Series, b: pd.Series) -> Paired:
        seeds = a.index.intersection(b.index)
        return cls(a.loc[seeds].to_numpy(), b.loc[seeds].to_numpy())

    def wins(self, scoring: Scoring) -> int:
        return int(scoring.better(self.a, self.b).sum())

    @property
    def seeds(self) -> int:
        return len(self.a)


def learner_cell(runs: pd.DataFrame, scoring: Scoring, mechanism: str, epsilon: float | None) -> Paired:
    return Paired.of(_by_seed(runs, scoring, TREES, mechanism, epsilon),
                     _by_seed(runs, scoring, NETWORK, mechanism, epsilon))


def _named(cells: Sequence[tuple[str, float | None]]) -> str:
    """Cells grouped by mechanism: ``opt-unbiased at ε = 1, 2; non-private``."""
    epsilons: dict[str, list[float]] = {}
    for mechanism, epsilon in cells:
        epsilons.setdefault(mechanism, [])
        if epsilon is not None:
            epsilons[mechanism].append(epsilon)
    return "; ".join(f"{m} at ε = {', '.join(f'{e:g}' for e in es)}" if es else m for m, es in epsilons.items())


def _verdict(pairs: dict[tuple[str, float | None], Paired], scoring: Scoring) -> list[str]:
    """Where trees win in every seed, where the MLP does, and where the seeds disagree."""
    trees = [key for key, p in pairs.items() if p.seeds and p.wins(scoring) == p.seeds]
    network = [key for key, p in pairs.items() if p.seeds and scoring.better(p.b, p.a).sum() == p.seeds]
    mixed = [key for key, p in pairs.items() if p.seeds and key not in trees and key not in network]
    return [f"Trees better in every seed: {_named(trees) or 'nowhere'}.",
            f"MLP better in every seed: {_named(network) or 'nowhere'}.",
            *([f"Seeds disagree: {_named(mixed)}."] if mixed else [])]


def learner_lines(runs: pd.DataFrame, scoring: Scoring, mechanisms: Sequence[str],
                  epsilons: Sequence[float]) -> list[str]:
    """The trees-against-MLP table of one dataset (its runs of both learners): per mechanism × ε the change of the
    mean metric from the MLP to the trees and in how many seeds the trees were better, then the verdict."""
    what = "accuracy, in percentage points" if scoring.higher_is_better else "loss, relative to the MLP's"
    reference = learner_cell(runs, scoring, "non-private", None)
    pairs: dict[tuple[str, float | None], Paired] = {("non-private", None): reference}
    for mechanism in mechanisms:
        for epsilon in epsilons:
            pairs[(mechanism, epsilon)] = learner_cell(runs, scoring, mechanism, epsilon)

    def cell(mechanism: str, epsilon: float) -> str:
        paired = pairs[(mechanism, epsilon)]
        if not paired.seeds:
            return "—"
        text = f"{scoring.change(paired.a.mean(), paired.b.mean())} ({paired.wins(scoring)}/{paired.seeds})"
        return f"**{text}**" if paired.wins(scoring) == paired.seeds else text

    return ["Trees against the MLP, paired by seed on the same release (change of the mean test "
            f"{what}; in parentheses the seeds where the trees were better; bold: in every seed). Non-private "
            f"(true labels): {scoring.change(reference.a.mean(), reference.b.mean())} "
            f"({reference.wins(scoring)}/{reference.seeds}).", "",
            *report.epsilon_table(mechanisms, epsilons, cell), "", *_verdict(pairs, scoring), ""]


def best_mechanism(runs: pd.DataFrame, scoring: Scoring, model: str, mechanisms: Sequence[str],
                   epsilon: float) -> tuple[str, str | None, Paired | None]:
    """The mechanism with the best mean metric under ``model`` at ``epsilon``, the runner-up and their pairing
    (winner as ``a``) by seed."""
    values = {m: _by_seed(runs, scoring, model, m, epsilon) for m in mechanisms}
    ranked = sorted((m for m in mechanisms if len(values[m])), key=lambda m: values[m].mean(),
                    reverse=scoring.higher_is_better)
    if len(ranked) < 2:
        return (ranked[0] if ranked else "—"), None, None
    return ranked[0], ranked[1], Paired.of(values[ranked[0]], values[ranked[1]])


def winner_lines(runs: pd.DataFrame, scoring: Scoring, models: Sequence[str], mechanisms: Sequence[str],
                 epsilons: Sequence[float]) -> list[str]:
    """Per learner and ε: the best mechanism and how many seeds it beat the runner-up in."""
    cells = {(model, epsilon): best_mechanism(runs, scoring, model, mechanisms, epsilon)
             for model in models for epsilon in epsilons}

    def cell(model: str, epsilon: float) -> str:
        best, second, paired = cells[(model, epsilon)]
        if second is None or paired is None:
            return best
        return f"{best} (vs {second}: {paired.wins(scoring)}/{paired.seeds})"

    lines = ["Best private mechanism by mean, per learner (in parentheses the runner-up and the seeds where the "
             "best beat it):", "", *report.epsilon_table(models, epsilons, cell, header="learner"), ""]
    for name in mechanisms:
        won = {model: [e for e in epsilons if cells[(model, e)][0] == name] for model in models}
        if any(won.values()):
            lines.append(f"{name} is best under " + "; ".join(
                f"{model} at ε = {', '.join(f'{e:g}' for e in es) or 'none'}" for model, es in won.items()) + ".")
    return [*lines, ""]
