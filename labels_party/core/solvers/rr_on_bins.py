"""Optimal RR-on-Bins (Definition 22; GKK+23) for the squared noisy-label loss, in O(|Y|) memory.

With m outputs and bins B_1..B_m (contiguous in the sorted labels — the optimal Φ is monotone), the loss is

    G = Σ_j [ (e^ε − 1) Σ_{y∈B_j} p_y g(ŷ_j, y) + Σ_{all y} p_y g(ŷ_j, y) ] / (e^ε + m − 1),

and bin j's best output is the mean of y under the weights p_y (1 + κ·1[y ∈ B_j]), κ = e^ε − 1. With the labels
centred on the prior mean μ (the loss does not change when labels and outputs move together) and the bin sums
X0(B) = Σ_B p_y, X1(B) = Σ_B p_y (y − μ), the whole loss collapses to

    G = ½ Var_p(y) − ½ R,    R = Σ_j g(B_j) / (κ + m),    g(B) = κ² X1(B)² / (1 + κ X0(B)),

so the best bins maximize the ratio R. Dinkelbach's method turns that into a few partition problems

    F(λ) = max over partitions of Σ_j (g(B_j) − λ)  −  λκ,    then λ ← R(the best partition),

until F(λ) = 0. Each is a DP over prefixes whose state is the prefix alone (no bin count): O(|Y|²) time and O(|Y|)
memory, where the DP over (prefix, bin count) took O(|Y|³) time and O(|Y|²) memory (|Y| = 20,000 had not finished
after 180 s and 21 GB). F is convex and decreasing in λ, and the λ's increase to the optimum superlinearly (a
handful of rounds; the solver reports how many).

The Monge speed-ups (SMAWK, Knuth–Yao, divide and conquer over monotone split points) would make each round
faster but do not apply: −g violates the quadrangle inequality whenever bins lie on one side of μ (the 1 in the
denominator is the mass that stays outside the bin), and the split points of the per-bin-count DP are not
monotone either; ``tests/labels_party/solvers/test_rr_on_bins.py`` shows both on small priors and checks this
solver against the brute-force DP over (prefix, bin count).

Ties (equal R within rounding) go to the fewest bins: every bin pays an extra 10⁻¹² of an upper bound on Σ g
(Cauchy–Schwarz: Σ_j g(B_j) ≤ κ Var_p(y)), so zero-prior labels join a neighbouring bin instead of forming one.
"""

from __future__ import annotations

import math

import numpy as np

from labels_party.core.solvers.deadline import NO_DEADLINE, Deadline
from shared.mechanisms.finite import normalized_prior
from shared.mechanisms.randomized_response import RandomizedResponse, rr_on_bins
from shared.privacy import design_epsilon

TIE_BREAK = 1e-12  # per bin, relative to κ Var_p(y) ≥ Σ g
MAX_ROUNDS = 100  # Dinkelbach rounds; each strictly increases λ, and the partitions are finite


def best_partition(c0: np.ndarray, c1: np.ndarray, kappa: float, penalty: float,
                   deadline: Deadline = NO_DEADLINE) -> np.ndarray:
    """Bin edges 0 = b_0 < … < b_m = |Y| maximizing Σ_j (g(B_j) − penalty); ``c0``, ``c1`` are the prefix sums of p
    and p (y − μ) with a leading 0. value[b] = max over a < b of value[a] + g(a, b) − penalty."""
    k = c0.size - 1
    value = np.empty(k + 1)
    value[0] = 0.0
    start = np.zeros(k + 1, dtype=np.int64)
    first, second = np.empty(k), np.empty(k)  # scratch: no allocation per prefix
    inverse = 1.0 / kappa
    for b in range(1, k + 1):
        if b % 1024 == 0:
            deadline.check("RR-on-Bins")
        x1 = np.subtract(c1[b], c1[:b], out=first[:b])
        x0 = np.subtract(inverse + c0[b], c0[:b], out=second[:b])
        np.square(x1, out=x1)
        np.divide(x1, x0, out=x1)  # g(a, b) / κ = X1² / (1/κ + X0)
        x1 *= kappa
        x1 += value[:b]
        a = int(np.argmax(x1))
        value[b] = x1[a] - penalty
        start[b] = a
    edges = [k]
    while edges[-1] > 0:
        edges.append(int(start[edges[-1]]))
    return np.array(edges[::-1], dtype=np.int64)


def _bin_sums(c0, c1, edges):
    return np.diff(c0[edges]), np.diff(c1[edges])


def solve_rr_on_bins(values, prior, epsilon: float, *, deadline: Deadline = NO_DEADLINE) -> RandomizedResponse:
    """The RR-on-Bins randomizer of least noisy-label loss under ``prior`` (labels sorted ascending)."""
    epsilon = float(epsilon)  # valid: checked by labels_party.core.registry
    values = np.asarray(values, dtype=np.float64)
    prior = normalized_prior(prior, values.size)
    kappa = math.expm1(design_epsilon(epsilon))
    mean = float(prior @ values)
    centred = values - mean
    c0 = np.concatenate([[0.0], np.cumsum(prior)])
    c1 = np.concatenate([[0.0], np.cumsum(prior * centred)])
    penalty = TIE_BREAK * kappa * float(prior @ centred**2)
    ratio, best, rounds = 0.0, None, 0
    while rounds < MAX_ROUNDS:
        deadline.check("RR-on-Bins")
        rounds += 1
        edges = best_partition(c0, c1, kappa, ratio + penalty, deadline)
        x0, x1 = _bin_sums(c0, c1, edges)
        improved = float(np.sum(kappa**2 * x1**2 / (1.0 + kappa * x0))) / (kappa + x0.size)
        # Dinkelbach: F(λ) = Σ g − λ (κ + m) at the partition found is positive until λ is the optimal ratio; at
        # λ* the partition found is optimal and, by the tie-break, has the fewest bins among the optimal ones.
        if best is None or improved >= ratio * (1 - 1e-12):
            best = (edges, x0, x1)
        if improved <= ratio * (1 + 1e-14):
            break
        ratio = improved
    assert best is not None  # the first round always sets it
    edges, x0, x1 = best
    bins = x0.size
    outputs = mean + kappa * x1 / (1.0 + kappa * x0)
    bin_of_label = np.repeat(np.arange(bins), np.diff(edges))
    return rr_on_bins(values, bin_of_label, outputs, epsilon,
                      parameters={"bin_edges": edges.tolist(), "dinkelbach_rounds": rounds})
