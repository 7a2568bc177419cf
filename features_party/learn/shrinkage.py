"""Shrinkage of a fixed-mechanism job's model toward the mean of its training labels (issue 39: defaults that
survive noise). A model trained on the labels of an *unbiased* randomizer (opt-unbiased, Laplace, staircase...)
can fit their noise: at ε = 0.5 a weak-signal table's MLP was 3.4 times worse than predicting the mean. The job
keeps the model's predictions f only as far as its own labels support them: c + w·(f − m) (on the log scale for
the Poisson loss), w in :data:`WEIGHTS` — w = 0 is the constant c, the mean of the training rows' released labels
(unbiased, like every label) — with w the least loss on the learner's validation split (the rows it did not fit
on: :func:`features_party.learn.train.validation_split` of the job's seed), where the loss against unbiased labels is
the true loss up to a constant that does not depend on w (squared: E[(p − ỹ)²] = E[(p − y)²] + Var(ỹ | y);
Poisson: p − ỹ·log p is linear in ỹ). Post-processing of what was released; nothing more is charged.

Biased mechanisms' labels (RR-on-Bins, clipped Laplace) are pulled toward a prior, so a loss measured on them is not
the true loss: those models are kept as trained, and classes keep theirs too (a class model's argmax does not
shrink)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from features_party.learn.gbdt import GbdtResult
from features_party.learn.output import Output
from features_party.learn.train import TrainResult, validation_split
from shared.validation import PrivatizedLabels, eligibility_z

WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)  # 1: the model as trained; 0: the constant
# As auto chooses (features_party/auto.py): a weight is kept only when its difference from the constant is below 0
# by Z standard errors, Bonferroni's over the weights (the labels of a small ε are so noisy that the least mean
# alone picks at random: at ε = 0.5 a model of pure noise looked 5.8 better than the constant on 800 rows, with a
# standard error of 8); among those, the least difference + Z_CHOICE standard errors; none: the constant.
Z, Z_CHOICE = eligibility_z(len(WEIGHTS) - 1), 0.5
MIN_VALIDATION_ROWS = 50  # fewer: the model is kept as trained (a loss on a handful of noisy labels decides nothing)


@dataclass(frozen=True)
class Shrinkage:
    """The chosen map and, per weight, its mean loss minus the constant's on the validation rows' released labels
    (an unbiased estimate of the true difference; 0 at w = 0) and its standard error."""

    output: Output
    differences: dict[float, tuple[float, float]]
    rows: int

    def to_dict(self) -> dict:
        return {"weight": self.output.weight, "constant": self.output.constant, "center": self.output.center,
                "validation_rows": self.rows,
                "differences": [{"weight": w, "difference": d, "standard_error": se}
                                for w, (d, se) in self.differences.items()],
                "constant_source": "the mean of the training rows' released labels (unbiased)"}


def choose(result: TrainResult | GbdtResult, numeric: np.ndarray, categorical: np.ndarray,
           labels: PrivatizedLabels, loss: str) -> Shrinkage | None:
    """The weight shown best on the learner's validation rows (see :data:`Z`); ``labels``: the training rows' released,
    unbiased labels, in the order the learner saw them (:class:`PrivatizedLabels` refused any other mechanism).
    None when there are too few validation rows."""
    config = result.config
    validation, _ = validation_split(len(labels), config.validation_fraction, np.random.default_rng(config.seed))
    if validation.size < MIN_VALIDATION_ROWS:
        return None
    poisson = loss == "poisson"
    mean = float(labels.noisy.mean())
    constant = max(mean, 1e-6) if poisson else mean
    raw = np.asarray(result.predict(numeric, categorical), dtype=np.float64)
    if not np.all(np.isfinite(raw)):  # a model that diverged: left as trained (its job says so), no NaN reported
        return None
    center = float(np.mean(np.log(np.maximum(raw, 1e-300)) if poisson else raw))
    judging = labels.subset(np.isin(np.arange(len(labels)), validation))
    in_order = raw[np.sort(validation)]
    differences: dict[float, tuple[float, float]] = {0.0: (0.0, 0.0)}
    for weight in WEIGHTS[1:]:  # each weight's loss minus the constant's: unbiased for the true difference
        predicted = Output("shrunk", constant, center, weight, poisson).apply(in_order)
        terms = (judging.poisson(predicted) - judging.poisson(constant) if poisson
                 else judging.squared_difference(predicted, constant))
        differences[weight] = (float(terms.mean()), float(terms.std(ddof=1) / np.sqrt(terms.size)))
    shown = [w for w in WEIGHTS[1:] if differences[w][0] + Z * differences[w][1] < 0]
    best = min(shown, key=lambda w: differences[w][0] + Z_CHOICE * differences[w][1]) if shown else 0.0
    output = Output() if best == 1.0 else Output("shrunk", constant, center, best, poisson)
    return Shrinkage(output, differences, int(validation.size))
