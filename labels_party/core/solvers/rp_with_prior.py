"""RPWithPrior (Liu & Huang, "RPWithPrior: Label Differential Privacy in Regression", TMLR 2026; public code
liuhaixias1/Response_privacy), on a finite grid of labels.

The paper's mechanism, for a prior f and ε: choose an interval [A1, A2] maximizing

    Pr_f[y ∈ [A1, A2]] · 2δ e^ε / (2δ e^ε + A2 − A1),

the probability that the label is in the interval and the output within δ of it; clip the label to the interval
(y' = min(max(y, A1), A2)) and release a value with density e^ε/Z within δ of y' and 1/Z elsewhere on the output
range, Z = 2δ e^ε + (A2 − A1). Every output has density 1/Z or e^ε/Z whatever the label, so it is ε-DP.

On the domain's grid (labels v_0 < … < v_{K−1}; a continuous domain's grid after randomized rounding), with the
interval the grid points a..b (m = b − a + 1 of them) and the window 2w + 1 of them: Pr[output v_z | label v_i] is
e^ε/Z on the window around the clipped index and 1/Z on the rest of a..b, Z = (2w + 1) e^ε + m − 2w − 1. Two
departures, both said here: the window *slides* to stay inside a..b near its ends (the paper's window reaches δ
beyond the interval, off the label domain; the normalizer is the same, so the guarantee is too), and the paper
tunes δ by hand per dataset — here each window w ∈ ``WINDOWS`` (up to m) gets the paper's best interval, and the w
whose mechanism has the least expected squared error under the prior is built (a function of the prior and ε
only: post-processing of the noisy prior, nothing more is charged). The matrix is quantized and certified like
every finite randomizer, at :func:`~shared.privacy.design_epsilon`.
"""

from __future__ import annotations

import math

import numpy as np

from shared.mechanisms.finite import FiniteRandomizer, normalized_prior
from shared.privacy import design_epsilon

WINDOWS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)  # half-widths, grid steps


def best_interval(prior: np.ndarray, epsilon: float, window: int) -> tuple[int, int]:
    """The paper's interval on the grid for half-window ``window``: (a, b) maximizing Pr[y ∈ a..b] · (2w+1) e^ε / Z
    over every a < b with more points than the window, 2w + 2 or more (ties: the first in (a, b) order): an interval
    no longer than the window would release every label alike — ε charged for nothing."""
    k = prior.size
    cumulative = np.concatenate([[0.0], np.cumsum(prior)])
    e, width = math.exp(epsilon), 2 * window + 1
    a, b = np.triu_indices(k, width)  # b − a ≥ 2w + 1
    points = b - a + 1
    score = (cumulative[b + 1] - cumulative[a]) * width * e / (width * e + points - width)
    best = int(np.argmax(score))
    return int(a[best]), int(b[best])


def rp_matrix(k: int, a: int, b: int, window: int, epsilon: float) -> np.ndarray:
    """Pr[output index a + j | label index i] (K x m) for interval a..b and half-window ``window``."""
    m, width, e = b - a + 1, 2 * window + 1, math.exp(epsilon)
    z = width * e + m - width
    clipped = np.clip(np.arange(k), a, b)
    low = np.clip(clipped - window, a, b - 2 * window) - a  # the window's first output, inside the interval
    outputs = np.arange(m)[None, :]
    inside = (outputs >= low[:, None]) & (outputs < low[:, None] + width)
    return np.where(inside, e / z, 1.0 / z)


def expected_squared_error(values: np.ndarray, prior: np.ndarray, matrix: np.ndarray, a: int) -> float:
    outputs = values[a:a + matrix.shape[1]]
    return float(prior @ (matrix * (outputs[None, :] - values[:, None]) ** 2).sum(axis=1))


def rp_with_prior(values, prior, epsilon: float) -> FiniteRandomizer:
    """RPWithPrior on the sorted grid ``values`` under ``prior``, certified at ≤ ``epsilon``."""
    epsilon = float(epsilon)  # valid: checked by labels_party.core.registry
    values = np.asarray(values, dtype=np.float64)
    prior = normalized_prior(prior, values.size)
    design = design_epsilon(epsilon)
    best: tuple[float, int, int, int, np.ndarray] | None = None
    for window in WINDOWS:
        if 2 * window + 2 > values.size:
            break
        a, b = best_interval(prior, design, window)
        matrix = rp_matrix(values.size, a, b, window, design)
        error = expected_squared_error(values, prior, matrix, a)
        if best is None or error < best[0]:
            best = (error, window, a, b, matrix)
    assert best is not None  # window 0 fits every domain of two labels or more
    error, window, a, b, matrix = best
    return FiniteRandomizer.from_probabilities("rp-with-prior", epsilon, values, values[a:b + 1], matrix, parameters={
        "interval": [float(values[a]), float(values[b])], "window": window,
        "expected_squared_error_under_prior": error})
