"""Which of a job's training rows do what, by a public rule on their ids (:func:`shared.splits.part_uniforms`), and
how ε is split: decided from the request alone, the same at every attempt, before anything is asked.

**Every job keeps estimate rows** (``estimate_fraction`` of its training rows, 0.1 by default): never trained on,
their labels released by an *unbiased* mechanism — the job's own when it is unbiased (one release covers them), else
a release of their own with the validation mechanism (opt-unbiased for numbers, K-ary randomized response for
classes) at the job's ε. Each example is in one release, so each is charged the job's ε once. The model, fixed
before they are read, is compared with the constant predictor on them (:mod:`shared.validation`): the job's
``estimate`` and its warning.

**An auto job** (``release.mechanism: "auto"``) splits its training rows into parts: ``selection`` (15 %: early
stopping, shrinkage and the choice among candidates), ``estimate`` (10 %: the final check against the constant and
the report) and one training part per candidate mechanism (the rest, evenly). The selection and estimate rows are
released by the validation mechanism together with the training part of that same mechanism when it is a
candidate (one release, one prior); every other part by its own mechanism. Disjoint parts: each example is in one
label release. For numeric labels ε is split too: a share ``mean_epsilon`` buys a central DP mean of all the
training rows (the labels service's evaluation metric ``mean``, noise (U − L)/(n·ε_mean)) — the constant predictor
that "never worse than knowing nothing" is measured against, known far better than any mean of locally privatized
labels — and the labels are released at ``label_epsilon`` = ε − ``mean_epsilon``. Every training row is therefore
charged ε_mean + ε_labels = ε exactly (both decimals of at most nine places, as the ledger counts).

Why examples are split rather than ε (for the labels): an example's label released twice at ε/2 by two mechanisms
is worth less to either than one release at ε to one of them, and a candidate trained on a part loses only that
part's share of the rows — the pooled candidate trains on every training part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal

import numpy as np
import pandas as pd

from shared.splits import part_uniforms

ESTIMATE, SELECTION = "estimate", "selection"
SELECTION_SHARE, AUTO_ESTIMATE_SHARE = 0.15, 0.10
# The candidate mechanisms of an auto job by label kind (its ``candidates``, default all): RR-on-Bins and RRWithPrior
# bias the labels toward the noisy prior, which wins where the signal is weak; LP-2ST's first stage is plain RR;
# ALIBI's soft labels (its noisy vectors' posterior under the model) won on the imbalanced storm-status table at
# ε 0.5 and 1 (docs/results/peers) — the MLP's only: a tree has no soft-label loss. K-ary RR (the validation
# mechanism of classes) is a candidate too: its labels are unbiased, so its part judges the others out of fold as
# opt-unbiased's does for numbers — judged on the selection rows alone, auto at ε 0.5 on storm-status returned the
# majority class in 2 of 5 seeds (error 0.51) where RR with trees had 0.30 (docs/results/auto).
REGRESSION_ARMS = ("opt-unbiased", "rr-on-bins")
CLASS_ARMS = ("rr", "rr-with-prior", "lp-2st", "alibi")
# Candidates a job may name besides (``release.candidates``), not among the defaults: each part costs the others
# rows. RPWithPrior won the fixed runs only where the signal is weak (labour-hours at ε 0.5 and 1, psid-weeks at
# ε ≤ 0.5: docs/results/peers), where auto returns the constant or a model near it anyway; BlockRR only with trees
# at ε ≥ 1 on storm-status, where RR's trees were as good (docs/results/auto/opt-in has auto with them).
OPT_IN_ARMS = {"regression": ("rp-with-prior",), "classes": ("block-rr",)}
SOFT_ARMS = ("alibi",)  # their parts train on per-class targets, not labels: never pooled with the others
# the candidates released in one go (LP-2ST's stages are asked for while it trains)
ARM_RELEASES = ("opt-unbiased", "rr-on-bins", "rr-with-prior", "alibi", "rp-with-prior", "block-rr")
VALIDATION_MECHANISM = {"regression": "opt-unbiased", "classes": "rr"}
# Unbiased too, and refused by no domain or ε the labels party takes: numbers' validation mechanism when the labels
# party would refuse opt-unbiased (more labels than its solver takes, the labels' ε under its floor).
VALIDATION_FALLBACK = {"opt-unbiased": "dbrr"}
# Training parts in proportion (the rest: 1): the unbiased randomizers' models need the rows (their labels' variance
# averages out with n), and their parts judge the others; RR-on-Bins' win where a model is near the constant anyway,
# which few rows learn.
ARM_WEIGHTS = {"opt-unbiased": 2.0, "rr": 2.0}

# The mean's share of ε. The constant c is the bar every candidate must beat, so its noise must be small against
# the gap a test set sees between the training and test means: with a noise standard deviation
# √2·(U − L)/(n·ε_mean) of (U − L)/253 (the earlier target), one psid-weeks seed of 25 (3,332 rows, U − L = 51, a
# training-test gap of 0.28) drew a 2.9-sd error and the constant was 1.029× the training mean's test loss. Now at most
# (U − L)/640 (0.08 there; a 0.46 error, the 1.02 bar, is then an 8-scale Laplace draw, P = 2·10⁻⁴): ε_mean =
# √2·640/n, at least 2 % and at most 75 % of ε (a small table at ε 0.25 learns little from labels at 0.06 or 0.12:
# the constant is what it returns), and at least the labels service's smallest ε.
MEAN_TARGET = math.sqrt(2) * 640
MEAN_SHARE_BOUNDS = (0.02, 0.75)
MIN_EPSILON = 1e-3


def unbiased(mechanism: str, clip: bool, classes: bool) -> bool:
    """Whether a release request's mechanism is unbiased (E[ŷ | y] = y, or K-ary RR for classes), by its name."""
    if classes:
        return mechanism == "rr"
    return mechanism in ("opt-unbiased", "dbrr") or (mechanism in ("laplace", "staircase") and not clip)


def lp_mst_parts(n: int, stages: int, seed: int, fractions: list[float] | None = None) -> list[np.ndarray]:
    """LP-MST's stages' disjoint parts of ``n`` examples (positions), in ``fractions`` (default equal): a
    label-independent, seeded permutation — known when the job is planned, so each stage's release can be checked
    before the first is charged."""
    fractions = fractions or [1.0 / stages] * stages
    order = np.random.default_rng(seed).permutation(n)
    bounds = np.concatenate([[0], np.round(np.cumsum(fractions) / np.sum(fractions) * n).astype(int)])
    return [order[bounds[t]:bounds[t + 1]] for t in range(stages)]


def estimate_mask(example_ids, fraction: float, seed: int) -> np.ndarray:
    """The rows a job keeps for its estimate (none for fraction 0)."""
    if fraction <= 0:
        return np.zeros(len(example_ids), dtype=bool)
    return part_uniforms(example_ids, ESTIMATE, seed) < fraction


def decimal_epsilon(value: float) -> Decimal:
    """ε as the ledger reads it: the decimal of its shortest repr."""
    return Decimal(repr(float(value)))


@dataclass(frozen=True)
class AutoPlan:
    """An auto job's parts and ε split (see the module)."""

    arms: tuple[str, ...]
    classes: bool
    epsilon: float
    mean_epsilon: float  # 0 for classes (the majority class needs no central release)
    seed: int
    validation: str  # the unbiased mechanism of the selection and estimate rows (VALIDATION_MECHANISM, or dbrr)

    @classmethod
    def build(cls, arms: tuple[str, ...], classes: bool, epsilon: float, rows: int, seed: int,
              validation: str | None = None) -> AutoPlan:
        mean = 0.0 if classes else mean_epsilon(epsilon, rows)
        return cls(arms, classes, epsilon, mean, seed,
                   validation or VALIDATION_MECHANISM["classes" if classes else "regression"])

    @property
    def label_epsilon(self) -> float:
        return float(decimal_epsilon(self.epsilon) - decimal_epsilon(self.mean_epsilon))

    @property
    def arm_shares(self) -> np.ndarray:
        """Each candidate's share of the training rows (:data:`ARM_WEIGHTS`, normalized)."""
        weights = np.array([ARM_WEIGHTS.get(arm, 1.0) for arm in self.arms])
        return weights / weights.sum()

    def parts(self, example_ids) -> np.ndarray:
        """Each id's part: ``selection``, ``estimate`` or a candidate mechanism (an object array)."""
        u = part_uniforms(example_ids, "auto", self.seed)
        position = (u - SELECTION_SHARE - AUTO_ESTIMATE_SHARE) / (1 - SELECTION_SHARE - AUTO_ESTIMATE_SHARE)
        arm = np.minimum(np.searchsorted(np.cumsum(self.arm_shares), position, side="right"), len(self.arms) - 1)
        names = np.array(self.arms, dtype=object)[np.maximum(arm, 0)]
        names[u < SELECTION_SHARE + AUTO_ESTIMATE_SHARE] = ESTIMATE
        names[u < SELECTION_SHARE] = SELECTION
        return names

    def folds(self, example_ids) -> pd.Series:
        """True for the first of two folds (by a public hash, independent of the parts): the validation
        mechanism's training part is fitted on one fold and judged on the other (features_party/auto.py)."""
        ids = pd.Index([str(i) for i in example_ids])
        return pd.Series(part_uniforms(ids, "fold", self.seed) < 0.5, index=ids)

    def smallest_fit(self, example_ids) -> int:
        """The fewest rows any of this job's candidate fits trains on (features_party/auto.py ``designs``): a fold
        of the validation mechanism's part when it is a candidate, else the smallest candidate's part."""
        ids = pd.Index([str(i) for i in example_ids])
        parts = pd.Series(self.parts(ids), index=ids)
        sizes = {arm: int((parts == arm).sum()) for arm in self.arms}
        if self.validation in sizes:
            folds = self.folds(ids)[parts == self.validation]
            sizes[self.validation] = int(min(folds.sum(), (~folds).sum()))
        return min(sizes.values())

    def releases(self, example_ids) -> list[tuple[str, str, list[str]]]:
        """The label releases to ask for first, as (key suffix, mechanism, example ids): the validation mechanism's
        (selection, estimate and its own training part) and one per other candidate released in one go (LP-2ST's
        stages are asked for while it trains)."""
        ids = np.asarray([str(i) for i in example_ids], dtype=object)
        parts = self.parts(ids)
        validation = np.isin(parts, [SELECTION, ESTIMATE]) | (parts == self.validation)
        out = [(self.validation, self.validation, ids[validation].tolist())]
        out += [(arm, arm, ids[parts == arm].tolist()) for arm in self.arms
                if arm != self.validation and arm in ARM_RELEASES and np.any(parts == arm)]
        return out

    def describe(self) -> dict:
        return {"candidates": list(self.arms), "candidate_shares": [float(x) for x in self.arm_shares],
                "validation_mechanism": self.validation, "epsilon": self.epsilon,
                "mean_epsilon": self.mean_epsilon, "label_epsilon": self.label_epsilon,
                "shares": {SELECTION: SELECTION_SHARE, ESTIMATE: AUTO_ESTIMATE_SHARE,
                           "training": 1 - SELECTION_SHARE - AUTO_ESTIMATE_SHARE}, "seed": self.seed}


def mean_epsilon(epsilon: float, rows: int) -> float:
    """The mean's share of ε (see :data:`MEAN_TARGET`), rounded down to 6 significant digits (an exact decimal)."""
    low, high = MEAN_SHARE_BOUNDS
    share = min(high, max(low, MEAN_TARGET / (max(rows, 1) * epsilon)))
    value = max(share * epsilon, MIN_EPSILON)
    exponent = math.floor(math.log10(value)) - 5
    quantum = Decimal(1).scaleb(exponent)
    return float(Decimal(repr(value)).quantize(quantum, rounding=ROUND_FLOOR))
