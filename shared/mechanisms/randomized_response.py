"""Randomized-response family: every mechanism here is public given its parameters (no prior needed, or a prior
that is itself DP output), so both parties can rebuild it.

* K-ary randomized response (Definition 21), on any finite set of label values.
* Debiased randomized response (Definition 23): RR onto Φ(y) = ((e^ε+|Y|-1) y - Σ y') / (e^ε-1), unbiased.
* RR-on-Bins (Definition 22) for a given map Φ: Y → Ŷ (the optimal map is solved in labels_party).
* RR-Top-k over a given set of k candidate classes ("Deep Learning with Label DP").
"""

from __future__ import annotations

import numpy as np

from shared.mechanisms.finite import FiniteRandomizer
from shared.privacy import check_epsilon, design_epsilon


def _rr_matrix(k: int, epsilon: float) -> np.ndarray:
    e = np.exp(epsilon)
    matrix = np.full((k, k), 1.0 / (e + k - 1))
    np.fill_diagonal(matrix, e / (e + k - 1))
    return matrix


def randomized_response(values, epsilon: float) -> FiniteRandomizer:
    """Output the true label w.p. e^ε/(e^ε+K-1), each other label w.p. 1/(e^ε+K-1)."""
    epsilon = check_epsilon(epsilon)
    values = np.asarray(values, dtype=np.float64)
    return FiniteRandomizer.from_probabilities("rr", epsilon, values, values,
                                               _rr_matrix(values.size, design_epsilon(epsilon)),
                                               {"num_labels": values.size})


def debiased_outputs(values, epsilon: float) -> np.ndarray:
    """Φ(y) of debiased RR: the unique outputs that make RR over them unbiased (Definition 23)."""
    values = np.asarray(values, dtype=np.float64)
    e = np.exp(epsilon)
    return ((e + values.size - 1) * values - values.sum()) / (e - 1)


def debiased_randomized_response(values, epsilon: float) -> FiniteRandomizer:
    """RR whose report for label j is Φ(j): E[output | y] = y exactly (up to the sampled rounding)."""
    epsilon = check_epsilon(epsilon)
    values = np.asarray(values, dtype=np.float64)
    eps = design_epsilon(epsilon)
    return FiniteRandomizer.from_probabilities("dbrr", epsilon, values, debiased_outputs(values, eps),
                                               _rr_matrix(values.size, eps), {"num_labels": values.size})


def rr_on_bins(values, bin_of_label, bin_outputs, epsilon: float, name: str = "rr-on-bins",
               parameters: dict | None = None) -> FiniteRandomizer:
    """RR over the m bin outputs: Φ(y) = bin_outputs[bin_of_label[y]] w.p. e^ε/(e^ε+m-1), each other output
    w.p. 1/(e^ε+m-1)."""
    epsilon = check_epsilon(epsilon)
    bin_of_label = np.asarray(bin_of_label, dtype=np.int64)
    bin_outputs = np.asarray(bin_outputs, dtype=np.float64)
    m = bin_outputs.size
    e = np.exp(design_epsilon(epsilon))
    matrix = np.full((bin_of_label.size, m), 1.0 / (e + m - 1))
    matrix[np.arange(bin_of_label.size), bin_of_label] = e / (e + m - 1)
    # Bins can share an output value (bins holding only zero-prior labels take their neighbours' mean): one output
    # per value, whose column is the sum of theirs — the same distribution over values, and a sum of ε-DP
    # columns is ε-DP.
    outputs, which = np.unique(bin_outputs, return_inverse=True)
    merged = np.zeros((bin_of_label.size, outputs.size))
    np.add.at(merged.T, which, matrix.T)
    return FiniteRandomizer.from_probabilities(name, epsilon, values, outputs, merged,
                                               {"num_bins": m, **(parameters or {})})


def rr_top_k(num_classes: int, candidates, epsilon: float, name: str = "rr-top-k",
             parameters: dict | None = None) -> FiniteRandomizer:
    """RR-Top-k: if y is a candidate, report y w.p. e^ε/(e^ε+k-1) and each other candidate w.p. 1/(e^ε+k-1);
    otherwise report a uniformly random candidate. Outputs are the classes; non-candidates are never output."""
    epsilon = check_epsilon(epsilon)
    candidates = np.asarray(candidates, dtype=np.int64)
    k = candidates.size
    e = np.exp(design_epsilon(epsilon))
    matrix = np.zeros((num_classes, num_classes))
    matrix[:, candidates] = 1.0 / k
    is_candidate = np.zeros(num_classes, dtype=bool)
    is_candidate[candidates] = True
    for c in candidates:
        matrix[c, candidates] = 1.0 / (e + k - 1)
        matrix[c, c] = e / (e + k - 1)
    classes = np.arange(num_classes)
    return FiniteRandomizer.from_probabilities(name, epsilon, classes, classes, matrix,
                                               {"k": k, "candidates": candidates.tolist(), **(parameters or {})})
