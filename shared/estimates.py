"""The features party's own estimate of its model's true-label test MSE from held-out labels privatized by an
*unbiased* mechanism: post-processing of a release it already has, built from what the release publishes (its
mechanism document) — no further call to the labels party, nothing charged.

Why it is unbiased. For an example with true label y, prediction f and privatized label ŷ drawn from the
mechanism's row for y, E[(f − ŷ)² | y] = (f − E[ŷ | y])² + Var(ŷ | y) = (f − y)² + Var(ŷ | y) when E[ŷ | y] = y
(hence the refusal of biased mechanisms, ``mechanism_biased``). Var(ŷ | y) depends on the unknown y, so it is
removed through a function h of the *released* value with E[h(ŷ) | y] = Var(ŷ | y) for every label y: h solves
M h = v, M the mechanism's matrix (rows: labels, columns: its distinct output values) and v its row variances.
Then each term (f − ŷ)² − h(ŷ) has mean (f − y)², and their average has mean the test MSE.

* Additive noise (unclipped Laplace, staircase): Var(ŷ | y) = step² · Var(Z) for every y, so h is that constant.
* Randomized response with one output per label (dbRR): M = q J + (p − q) I, so h = (v − q Σv) / (p − q).
* Any other matrix (the optimal unbiased randomizer): least squares, exact when v is in M's column space (M of full
  row rank, as the continuous solver builds it on a prior that gives every label weight). It is not when M's rows
  are dependent: the mesh solver's few outputs, or labels the noisy prior gives no weight, whose rows the solver
  makes mixtures of their neighbours' — no function of ŷ then has mean Var(ŷ | y) for every y. The estimate's mean
  is then off the MSE by at most the correction's miss, max_y |(M h)(y) − v(y)|, stated as
  :attr:`MSEEstimate.bias_bound` (weekly hours 0..60, 4,400 held out at ε = 2: bounds of 1 to 3 against an MSE
  near 250 and a standard error near 17; the realized bias about a tenth of the bound).

The standard error is the per-example terms' sample standard deviation over √n (the terms are independent, one
draw each), so it covers the noise and the spread of the squared errors. Labels off the mechanism's grid (continuous
labels, rounded at random to a neighbouring grid point before the mechanism) add the rounding's variance, which no
function of ŷ can remove: the estimate then overstates the MSE by at most Δ²/4 for grid spacing Δ
(:attr:`MSEEstimate.rounding_bound`; 0 when the domain's labels lie on the grid, e.g. integers on a lattice of step
1 — pass the dataset's ``domain`` to say so, else an additive mechanism's bound is its lattice's). The interval is the
normal one at the asked level widened by those bounds — by ``bias_bound`` on both sides and by ``rounding_bound``
below — so it covers the MSE at least as often as a normal interval covers the estimate's mean; it is the plain
normal interval exactly when both bounds are 0.

**For a model fixed before these labels were looked at.** The estimate is unbiased for one model chosen without
them. Scoring many models on the same privatized held-out labels and keeping the best one reuses them adaptively:
the chosen model's estimate is then biased downward (it is the minimum of noisy estimates — the reusable-holdout
problem), and its interval does not cover at its level. Choose among models on their own validation rows (a job's
``val_loss``), or on another release of other held-out examples, and score the chosen one here.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from shared.domains import Domain, FiniteLabels, Lattice, domain_from_spec
from shared.errors import ErrorCode, LabelDPError
from shared.mechanisms.additive import AdditiveNoiseRandomizer
from shared.mechanisms.documents import Sampler, sampler_from_description
from shared.mechanisms.randomized_response import RandomizedResponse
from shared.mechanisms.rounded import RoundedRandomizer

# A mechanism counts as unbiased when max_y |E[ŷ | y] − y| is at most this fraction of its label range: the
# unbiased mechanisms built here are off by float rounding (≈ 10⁻¹⁴ of the range), biased ones by a sizable part of
# it. A bias b moves the estimate by at most 2·b·mean|f − y|.
BIAS_TOLERANCE = 1e-6
# A variance correction that reproduces Var(ŷ | y) to this fraction of its largest value is exact (least squares on
# an exactly solvable system is off by ≈ 10⁻¹⁴ of it): its bias bound is 0.
VARIANCE_TOLERANCE = 1e-6


@dataclass(frozen=True)
class MSEEstimate:
    """The unbiased estimate of the mean of (prediction − true label)² over the scored examples (of a model fixed
    before they were looked at: see the module on choosing among models)."""

    estimate: float
    standard_error: float
    level: float
    # estimate ± z·standard_error at ``level``, widened by bias_bound on both sides and rounding_bound below (see
    # the module): its coverage is the normal interval's exactly when both bounds are 0, at least that otherwise
    confidence_interval: tuple[float, float]
    num_examples: int
    mechanism: str
    # |E[estimate] − MSE| is at most this (0 when the variance correction is exact; see the module)
    bias_bound: float
    # how much of the estimate can be the randomized rounding's variance, for labels off the mechanism's grid
    # (continuous labels, or a domain not given with an additive mechanism); labels on it (integers on a lattice of
    # step 1) add nothing
    rounding_bound: float


def unbiased_mse_estimate_from_document(predictions, noisy_labels, document: dict, *, level: float = 0.95,
                                        domain: Domain | dict | None = None) -> MSEEstimate:
    """:func:`unbiased_mse_estimate` for the mechanism a release's mechanism document states
    (``GET /v1/mechanisms/{hash}``: ``{"description": ..., "noisy_prior": ...}``), rebuilt exactly by
    :func:`~shared.mechanisms.documents.sampler_from_description`. ``domain``: the dataset's (its ``domain``
    object, or the domain), which says whether its labels lie on an additive mechanism's lattice (a document
    does not)."""
    description = document.get("description") if isinstance(document, dict) else None
    if not isinstance(description, dict):
        raise LabelDPError("a mechanism document is a JSON object with a 'description' object",
                           code=ErrorCode.INVALID_MECHANISM_DOCUMENT)
    try:
        mechanism = sampler_from_description(description)
    except LabelDPError as err:
        if err.code != "mechanism_not_supported_on_spark":
            raise
        raise LabelDPError(f"mechanism {description.get('mechanism')!r} releases no single number per label "
                           "(subset selection, a group release): no test-MSE estimate from it",
                           code=ErrorCode.MECHANISM_NOT_ESTIMABLE) from None
    rounding = description.get("rounding")  # a finite randomizer on a continuous domain's grid states the domain
    on_grid = isinstance(rounding, dict) and rounding.get("kind") == "continuous"
    return _estimate(predictions, noisy_labels, mechanism, level, _rounding_bound(mechanism, on_grid, domain))


def unbiased_mse_estimate(predictions, noisy_labels, mechanism: Sampler | RoundedRandomizer, *,
                          level: float = 0.95, domain: Domain | dict | None = None) -> MSEEstimate:
    """The estimate, its standard error and confidence interval (see the module) from each example's prediction
    and privatized label, in the same order (``domain``: as for :func:`unbiased_mse_estimate_from_document`).
    Refuses a biased mechanism (``mechanism_biased``), privatized labels it cannot output and mismatched or
    non-finite inputs (``invalid_input``)."""
    on_grid = isinstance(mechanism, RoundedRandomizer)
    sampler = mechanism.inner if isinstance(mechanism, RoundedRandomizer) else mechanism
    return _estimate(predictions, noisy_labels, sampler, level, _rounding_bound(sampler, on_grid, domain))


def _estimate(predictions, noisy_labels, mechanism: Sampler, level: float, rounding_bound: float) -> MSEEstimate:
    predictions, noisy_labels = _vectors(predictions, noisy_labels)
    if not 0 < level < 1:
        raise LabelDPError(f"level must be strictly between 0 and 1, not {level!r}", code=ErrorCode.INVALID_INPUT)
    check_unbiased(mechanism)
    correction, bias_bound = variance_correction(mechanism, noisy_labels)
    terms = (predictions - noisy_labels) ** 2 - correction
    estimate = float(terms.mean())
    standard_error = float(terms.std(ddof=1) / math.sqrt(terms.size))
    half = NormalDist().inv_cdf(0.5 + level / 2) * standard_error
    # E[estimate] is within bias_bound of the MSE, and above it by at most rounding_bound
    interval = (estimate - half - bias_bound - rounding_bound, estimate + half + bias_bound)
    return MSEEstimate(estimate, standard_error, level, interval, int(terms.size), mechanism.name, bias_bound,
                       rounding_bound)


def _vectors(predictions, noisy_labels) -> tuple[np.ndarray, np.ndarray]:
    predictions = np.asarray(predictions, dtype=np.float64).ravel()
    noisy_labels = np.asarray(noisy_labels, dtype=np.float64).ravel()
    if predictions.size != noisy_labels.size:
        raise LabelDPError(f"{predictions.size} predictions for {noisy_labels.size} privatized labels",
                           code=ErrorCode.INVALID_INPUT)
    if predictions.size < 2:
        raise LabelDPError("an estimate with a standard error needs at least 2 examples", code=ErrorCode.INVALID_INPUT)
    if not (np.all(np.isfinite(predictions)) and np.all(np.isfinite(noisy_labels))):
        raise LabelDPError("predictions and privatized labels must be finite numbers", code=ErrorCode.INVALID_INPUT)
    return predictions, noisy_labels


def check_unbiased(mechanism: Sampler) -> None:
    if isinstance(mechanism, AdditiveNoiseRandomizer):  # its bias is computed on labels: the lattice's points
        inputs = mechanism.lattice.value(np.arange(mechanism.lattice.steps + 1))
        mechanism = dataclasses.replace(mechanism, input_values=inputs)
    else:
        inputs = mechanism.input_values
    span = float(inputs.max() - inputs.min()) or max(1.0, float(np.abs(inputs).max()))
    bias = mechanism.max_abs_bias
    if not bias <= BIAS_TOLERANCE * span:
        raise LabelDPError(f"mechanism {mechanism.name!r} is biased (max |E[ŷ | y] − y| = {bias:.4g} on labels "
                           f"spanning {span:g}): the estimate is unbiased only for an unbiased mechanism "
                           "(opt-unbiased, dbrr, unclipped laplace or staircase)", code=ErrorCode.MECHANISM_BIASED)


def variance_correction(mechanism: Sampler, noisy_labels: np.ndarray) -> tuple[np.ndarray | float, float]:
    """h(ŷ) for every privatized label (a constant for additive noise), and max_y |E[h(ŷ) | y] − Var(ŷ | y)|."""
    if isinstance(mechanism, AdditiveNoiseRandomizer):
        return mechanism.noise_variance, 0.0
    if isinstance(mechanism, RandomizedResponse) and _one_output_per_label(mechanism):
        p, q = mechanism.keep_probability, mechanism.other_probability
        variance = mechanism.conditional_variance
        return _at(mechanism.output_values, (variance - q * variance.sum()) / (p - q), noisy_labels, mechanism), 0.0
    matrix, outputs = mechanism.matrix, mechanism.output_values
    values, column = np.unique(outputs, return_inverse=True)
    merged = np.zeros((matrix.shape[0], values.size))  # outputs sharing a value are one observation
    np.add.at(merged.T, column, matrix.T)
    variance = matrix @ outputs**2 - (matrix @ outputs) ** 2
    h, *_ = np.linalg.lstsq(merged, variance, rcond=None)
    miss = float(np.max(np.abs(merged @ h - variance)))
    # an exact solve misses by float rounding only: no bias to report
    bound = miss if miss > VARIANCE_TOLERANCE * max(float(variance.max()), 1e-300) else 0.0
    return _at(values, h, noisy_labels, mechanism), bound


def _one_output_per_label(mechanism: RandomizedResponse) -> bool:
    bins = mechanism.bin_of_input
    return bins is not None and bins.size == mechanism.output_values.size and bool(
        np.all(bins == np.arange(bins.size))) and np.unique(mechanism.output_values).size == bins.size


def _at(values: np.ndarray, h: np.ndarray, noisy_labels: np.ndarray, mechanism: Sampler) -> np.ndarray:
    """h at each privatized label, which must be one of ``values`` exactly (a release's values are exact)."""
    order = np.argsort(values)
    values, h = values[order], h[order]
    index = np.minimum(np.searchsorted(values, noisy_labels), values.size - 1)
    stray = values[index] != noisy_labels
    if np.any(stray):
        raise LabelDPError(f"{int(stray.sum())} privatized label(s) are not outputs of mechanism "
                           f"{mechanism.name!r}, e.g. {noisy_labels[np.argmax(stray)]!r} (labels of another "
                           "release?)", code=ErrorCode.INVALID_INPUT)
    return h[index]


def _rounding_bound(mechanism: Sampler, on_grid: bool, domain: Domain | dict | None) -> float:
    """Δ²/4 for the grid (additive noise: the lattice) that labels may be rounded onto (see :class:`MSEEstimate`);
    0 for a finite randomizer on the labels themselves, and for additive noise on a domain of finite labels that
    all lie on its lattice (integers on a lattice of step 1: nothing is rounded)."""
    if isinstance(mechanism, AdditiveNoiseRandomizer):
        labels = _finite_labels(domain)
        on_lattice = labels is not None and _on_lattice(labels, mechanism.lattice)
        return 0.0 if on_lattice else mechanism.lattice.step**2 / 4
    if on_grid:  # an evenly spaced grid: its spacing is the range over the gaps
        inputs = mechanism.input_values
        return float(((inputs.max() - inputs.min()) / (inputs.size - 1)) ** 2 / 4)
    return 0.0


def _finite_labels(domain: Domain | dict | None) -> np.ndarray | None:
    """The label values of a domain of finite labels (given as a domain or as a dataset's ``domain`` object); None
    for a continuous domain or none."""
    if isinstance(domain, dict):
        domain = domain_from_spec(domain)
    return domain.values if isinstance(domain, FiniteLabels) else None


def _on_lattice(labels: np.ndarray, lattice: Lattice) -> bool:
    try:
        positions = lattice.positions(labels)  # snapped when within 1e-9 of a lattice point
    except LabelDPError:  # labels beyond the lattice's ends: not the domain it was built for
        return False
    return bool(np.array_equal(positions, np.rint(positions)))
