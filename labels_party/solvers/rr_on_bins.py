"""Optimal RR-on-Bins (Definition 22; GKK+23) for the squared noisy-label loss, by dynamic programming.

With m outputs and bins B_1..B_m (contiguous in the sorted labels — the optimal Φ is monotone), the loss is

    G = Σ_j [ (e^ε - 1) Σ_{y∈B_j} p_y g(ŷ_j, y) + Σ_{all y} p_y g(ŷ_j, y) ] / (e^ε + m - 1),

which separates over bins: bin j's best ŷ_j is the mean of y under weights p_y (1 + (e^ε-1)·1[y ∈ B_j]) and
its cost is half the weighted sum of squares around it. A DP over prefixes finds the best bins for every m;
the best m wins (ties: fewest bins).
"""

from __future__ import annotations

import math

import numpy as np

from labels_party.solvers.deadline import NO_DEADLINE, Deadline
from shared.mechanisms.finite import FiniteRandomizer, normalized_prior
from shared.mechanisms.randomized_response import rr_on_bins
from shared.privacy import design_epsilon


def _bin_costs(values, prior, e):
    """cost[a, b] and output[a, b] for the bin of sorted labels a..b-1 (0 <= a < b <= k)."""
    k = values.size
    c0 = np.concatenate([[0.0], np.cumsum(prior)])
    c1 = np.concatenate([[0.0], np.cumsum(prior * values)])
    c2 = np.concatenate([[0.0], np.cumsum(prior * values * values)])
    a_idx, b_idx = np.meshgrid(np.arange(k + 1), np.arange(k + 1), indexing="ij")
    s0 = c0[-1] + (e - 1) * (c0[b_idx] - c0[a_idx])
    s1 = c1[-1] + (e - 1) * (c1[b_idx] - c1[a_idx])
    s2 = c2[-1] + (e - 1) * (c2[b_idx] - c2[a_idx])
    output = s1 / s0
    cost = 0.5 * np.maximum(s2 - s1 * output, 0.0)
    invalid = b_idx <= a_idx
    cost[invalid] = np.inf
    return cost, output


def solve_rr_on_bins(values, prior, epsilon: float, *, deadline: Deadline = NO_DEADLINE) -> FiniteRandomizer:
    epsilon = float(epsilon)  # checked once, by labels_party.registry
    values = np.asarray(values, dtype=np.float64)
    prior = normalized_prior(prior, values.size)
    eps = design_epsilon(epsilon)
    e = math.exp(eps)
    k = values.size
    cost, output = _bin_costs(values, prior, e)
    best = np.full(k + 1, np.inf)  # best[b]: cheapest split of labels 0..b-1 into the current number of bins
    best[0] = 0.0
    choices = []
    best_loss, best_m = np.inf, 1
    for m in range(1, k + 1):
        deadline.check("RR-on-Bins")
        totals = best[:, None] + cost  # totals[a, b]
        choice = np.argmin(totals, axis=0)
        best = totals[choice, np.arange(k + 1)]
        best[0] = np.inf
        choices.append(choice)
        loss = best[k] / (e + m - 1)
        if loss < best_loss * (1 - 1e-12) - 1e-15:  # ties (within rounding): fewer bins
            best_loss, best_m = loss, m
    # Backtrack the bins for best_m.
    bounds = [k]
    for m in range(best_m, 0, -1):
        bounds.append(int(choices[m - 1][bounds[-1]]))
    bounds = bounds[::-1]  # 0 = b_0 < b_1 < ... < b_m = k
    bin_of_label = np.zeros(k, dtype=np.int64)
    outputs = []
    for j in range(best_m):
        bin_of_label[bounds[j]:bounds[j + 1]] = j
        outputs.append(output[bounds[j], bounds[j + 1]])
    return rr_on_bins(values, bin_of_label, outputs, epsilon, parameters={"bin_edges": bounds})
