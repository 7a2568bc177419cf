"""What every benchmark and demo summary sets its private models against, and how it states their spread.

* The **non-private reference** (a model trained on the true labels) and the **mean predictor** (one constant:
  the training labels' mean, or their majority class for classes). Both need the true labels, so only the
  benchmarks and the demo compute them — they play both parties; no deployment path (the labels service least of
  all) ever does. A private model worse than the mean predictor carries no usable signal: :class:`Yardsticks`
  flags it, cell by cell (mechanism × ε).
* **Max |bias|** of the randomizer a release actually used, rebuilt from its public mechanism document
  (:func:`max_abs_bias`): reported next to the noisy-label loss, which alone does not rank mechanisms
  (:data:`NOISY_LOSS_CAVEAT`).
* One **sd** rule (:func:`sd`, :data:`SD_RULE`): the sample standard deviation over seeds, for every row.
* The **trees** of a non-private reference (:func:`job_trees`): what a trainer job with the default ``train.gbdt``
  trains, so that the trees' reference and their private jobs differ only in the labels.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from shared.errors import LabelDPError
from shared.mechanisms.additive import AdditiveNoiseRandomizer
from shared.mechanisms.documents import sampler_from_description

SD_DDOF = 1
SD_RULE = "sd: sample standard deviation over seeds (ddof = 1; — with a single seed)"
NOISY_LOSS_CAVEAT = (
    "Noisy-label loss alone does not rank mechanisms: a model learns E[ỹ | x], so a mechanism's bias moves the "
    "learned function while its variance averages out over examples — a biased mechanism such as RR-on-Bins can "
    "have the smallest noisy-label loss and the worst models; read max |bias| next to it.")
WARNING = "⚠"


def sd(values: Iterable[float]) -> float:
    """The sample standard deviation (ddof = 1) of finite values; NaN for fewer than two."""
    array = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=np.float64)
    return float(np.std(array, ddof=SD_DDOF)) if array.size > SD_DDOF else math.nan


def mean_sd(values: Iterable[float], digits: str = ".4g", sd_digits: str = ".2g") -> str:
    """``mean ± sd`` of the values (the sd by :func:`sd`), ``mean ± —`` for one value."""
    array = [float(v) for v in values]
    spread = sd(array)
    return f"{np.mean(array):{digits}} ± {'—' if math.isnan(spread) else format(spread, sd_digits)}"


def job_trees(loss: str, seed: int = 0, validation_fraction: float = 0.2):
    """The :class:`features_party.learn.gbdt.GbdtConfig` of a trainer job with the default tree options (``train.gbdt``
    omitted), for training the trees in process on the true labels."""
    from features_party.learn.gbdt import GbdtConfig  # XGBoost and JAX: only where trees are trained
    from features_party.schemas import GbdtOptions

    return GbdtConfig.from_dict({**GbdtOptions().model_dump(), "loss": loss, "seed": seed,
                                 "validation_fraction": validation_fraction})


def constant_prediction(train_labels, *, classes: bool) -> float:
    """The mean predictor's one prediction: the training labels' mean, or their majority class (lowest id on a
    tie) for class labels."""
    labels = np.asarray(train_labels, dtype=np.float64)
    if classes:
        return float(np.bincount(labels.astype(np.int64)).argmax())
    return float(labels.mean())


@dataclass(frozen=True)
class Yardsticks:
    """One dataset's references in the summary's metric: their per-seed values (the same splits as the private
    runs); ``higher_is_better`` for accuracy."""

    non_private: tuple[float, ...]
    constant: tuple[float, ...]
    higher_is_better: bool = False

    @property
    def constant_name(self) -> str:
        return "predicting the majority class" if self.higher_is_better else "predicting the training mean"

    @property
    def non_private_name(self) -> str:
        return "non-private (true labels)"

    def worse_than_constant(self, value: float) -> bool:
        """Strictly worse than the mean predictor's mean over seeds."""
        reference = float(np.mean(self.constant))
        return value < reference if self.higher_is_better else value > reference

    def mark(self, value: float, text: str) -> str:
        """A table cell's text, with :data:`WARNING` when its model is worse than the mean predictor."""
        return f"{text} {WARNING}" if self.worse_than_constant(value) else text

    def lines(self, metric: str, digits: str = ".4g", sd_digits: str = ".2g") -> list[str]:
        """The two reference lines of a summary (mean ± sd over seeds, :data:`SD_RULE`)."""
        return [f"Non-private reference (a model trained on the true labels), {metric}: "
                f"{mean_sd(self.non_private, digits, sd_digits)}.",
                f"Mean predictor ({self.constant_name}), {metric}: {mean_sd(self.constant, digits, sd_digits)}."]

    def legend(self, digits: str = ".4g") -> str:
        return f"{WARNING}: worse than {self.constant_name} ({np.mean(self.constant):{digits}})"

    def warning(self, cells: Mapping[tuple[str, float], float], digits: str = ".4g") -> str | None:
        """One line naming every (mechanism, ε) cell worse than the mean predictor, or None."""
        worse: dict[str, list[float]] = {}
        for (mechanism, epsilon), value in cells.items():
            if self.worse_than_constant(value):
                worse.setdefault(mechanism, []).append(epsilon)
        if not worse:
            return None
        named = "; ".join(f"{m} at ε = {', '.join(f'{e:g}' for e in sorted(es))}" for m, es in worse.items())
        return (f"**Warning** {WARNING}: worse than {self.constant_name} ({np.mean(self.constant):{digits}}), "
                f"so of no use as released: {named}.")

    def plot_lines(self) -> dict[str, float]:
        """The horizontal reference lines of a plot: label → value (means over seeds)."""
        return {self.non_private_name: float(np.mean(self.non_private)),
                self.constant_name: float(np.mean(self.constant))}


def max_abs_bias(description: dict, support) -> float | None:
    """max over labels of |E[ỹ | y] − y| of the randomizer(s) a release's mechanism document describes (a group
    release: the largest over its groups), on the domain's ``support`` (its labels, or a continuous domain's grid:
    the bias is linear in between). None where a release has no single noisy number per label (subset
    selection, central training)."""
    support = np.asarray(support, dtype=np.float64)
    if "groups" in description:  # columnar: each distinct randomizer once, its inputs/outputs omitted when the grid
        grid = description["grid"]
        parts = [{"input_values": grid, "output_values": grid, **part} for part in description["mechanisms"]]
        biases = [max_abs_bias(part, support) for part in parts]
        return None if any(b is None for b in biases) else max(b for b in biases if b is not None)
    try:
        randomizer = sampler_from_description(description)
    except LabelDPError:
        return None
    if isinstance(randomizer, AdditiveNoiseRandomizer):  # its document publishes no label vector: give it back
        randomizer = dataclasses.replace(randomizer, input_values=support)
    return float(randomizer.max_abs_bias)
