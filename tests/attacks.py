"""Reusable attacks on released numbers, for regression tests of every mechanism.

Exclusion attacks. An attacker who knows how the noise is sampled can sometimes rule labels out: "this published
value cannot be candidate + any value the sampler can return". Such an attack is *sound* — it never rules out the
true label — so under a pure ε-DP mechanism it can never rule out any label at all: ruling out y' is an event of
probability 0 when the label is y' (soundness), hence of probability <= e^ε · 0 = 0 when the label is y. The bound
these tests assert for exclusion attacks is therefore exactly zero identifications, at any ε. A mechanism that
fails it is not ε-DP as implemented, whatever its certificate says.

* :func:`consistent_with_float_laplace` — Mironov's least-significant-bit attack (CCS 2012) on numpy's
  ``Generator.laplace``, modelled bit for bit (``test_numpy_laplace_model_is_bit_exact`` checks the model).
* :func:`consistent_with_support` — the published value lies in the support the mechanism itself declares for
  the candidate (matrix entries, lattice, clip range). Catches samplers whose outputs leave the certified support.

Guessing attacks. Any attack that is not sound for the mechanism at hand — :func:`bayes_guess`, which picks the
most likely label under the published distribution, or the float-Laplace attack aimed at a mechanism that samples
something else — is a guesser: against an ε-DP mechanism and K equally likely labels it names the right label
with probability at most e^ε / (e^ε + K − 1) (:func:`guessing_bound`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats

from shared.mechanisms.additive import AdditiveNoiseRandomizer
from shared.mechanisms.finite import FiniteRandomizer
from shared.mechanisms.randomized_response import RandomizedResponse
from shared.mechanisms.rounded import RoundedRandomizer

_TWO53 = float(1 << 53)


def numpy_laplace(location: float, scale: float, uniform: float) -> float:
    """What ``numpy.random.Generator.laplace(location, scale)`` returns for the 53-bit uniform draw ``uniform``
    (numpy's distributions.c: loc - scale·log(2 - 2U) for U >= 1/2, loc + scale·log(2U) below), with libm's log
    as numpy's C code uses it."""
    if uniform >= 0.5:
        return location - scale * math.log(2.0 - uniform - uniform)
    return location + scale * math.log(uniform + uniform)


def consistent_with_float_laplace(published: float, candidate: float, scale: float) -> bool:
    """Can ``published`` be ``candidate + numpy_laplace(0, scale, U)`` for some 53-bit U? Sound: True whenever it
    can (the search covers every U whose noise rounds to ``published``; when there are too many, True)."""
    z = published - candidate
    u = 0.5 * math.exp(z / scale) if z < 0 else 1.0 - 0.5 * math.exp(-z / scale)
    slope = (u if z < 0 else 1.0 - u) / scale  # dU/dz
    width = 4 * math.ulp(published) + 4 * math.ulp(z) + 4 * math.ulp(candidate)
    window = int(math.ceil(width * slope * _TWO53)) + 4
    if window > 4096:
        return True  # the rounding of candidate + noise hides the noise's sparsity: cannot exclude
    center = int(round(u * _TWO53))
    for k in range(max(1, center - window), min((1 << 53) - 1, center + window) + 1):
        if candidate + numpy_laplace(0.0, scale, k / _TWO53) == published:
            return True
    return False


def consistent_with_support(mechanism, published, candidate: float) -> bool:
    """Is ``published`` an output ``mechanism`` can produce on ``candidate`` (by its own declared distribution)?"""
    if isinstance(mechanism, RoundedRandomizer):
        grid = mechanism.domain.grid.values
        rows = np.flatnonzero(np.isclose(grid, candidate, rtol=0, atol=1e-12))
        if rows.size == 0:  # off the grid: rounded to one of its two neighbours
            upper = int(np.searchsorted(grid, candidate))
            rows = np.array([upper - 1, upper])
        return any(_finite_possible(mechanism.inner, row, published) for row in rows)
    if isinstance(mechanism, FiniteRandomizer):
        return _finite_possible(mechanism, int(np.flatnonzero(mechanism.input_values == candidate)[0]), published)
    if isinstance(mechanism, RandomizedResponse):  # every output is possible for every label unless keep is all
        own = mechanism.output_values[mechanism.bin_of_input[mechanism.row_of([candidate])[0]]]
        return published in mechanism.output_values and (mechanism.num_outputs > 1 or published == own)
    if isinstance(mechanism, AdditiveNoiseRandomizer):
        lattice = mechanism.lattice
        steps = (published - lattice.low) / lattice.step
        if abs(steps - round(steps)) > 1e-6:
            return False
        return not mechanism.clip or 0 <= round(steps) <= lattice.steps
    return True  # subset selection: every set has positive probability under every label


def _finite_possible(mechanism: FiniteRandomizer, row: int, published: float) -> bool:
    column = np.flatnonzero(mechanism.output_values == published)
    return column.size == 1 and mechanism.counts[row, column[0]] > 0


def identified(candidates: Sequence, consistent: Callable[[object], bool]):
    """The one candidate consistent with what was published, or None when zero or several are."""
    alive = [c for c in candidates if consistent(c)]
    return alive[0] if len(alive) == 1 else None


def histogram_consistent(noisy_counts: Sequence[float], label_index: int, scale: float) -> bool:
    """A one-example release's noisy histogram is consistent with the example's label being ``label_index`` when
    every bin is (count 1 there, 0 elsewhere) under the float-Laplace model."""
    return all(consistent_with_float_laplace(float(v), 1.0 if j == label_index else 0.0, scale)
               for j, v in enumerate(noisy_counts))


def bayes_guess(published: float, candidates: Sequence[float], probability: Callable[[float, float], float]):
    """argmax over candidates of Pr[output = published | candidate] (ties: the first)."""
    scores = [probability(published, c) for c in candidates]
    return candidates[int(np.argmax(scores))]


def guessing_bound(trials: int, epsilon: float, num_labels: int, false_alarm: float = 1e-4) -> int:
    """The most correct guesses an ε-DP release allows in ``trials`` independent uniform-label trials, except with
    probability ``false_alarm``: the binomial upper quantile at p = e^ε / (e^ε + K − 1)."""
    p = math.exp(epsilon) / (math.exp(epsilon) + num_labels - 1)
    return int(stats.binom.ppf(1 - false_alarm, trials, p))

