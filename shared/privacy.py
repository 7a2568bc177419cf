"""Privacy parameters: validation, the safety margin mechanisms are built with, and the ε₁/ε₂ budget split."""

from __future__ import annotations

import math
from dataclasses import dataclass

from shared.errors import LabelDPError

# Mechanisms are constructed at a design ε a hair below the requested one, so that rounding to the exactly
# sampled probabilities (≤ 2**-53 per entry) and LP solver tolerance can never push the certified ε above the
# request. The utility cost of the margin is of the same negligible order.
EXACT_MARGIN = 1e-9
SOLVER_MARGIN = 1e-6


def check_epsilon(epsilon, name: str = "epsilon") -> float:
    try:
        value = float(epsilon)
    except (TypeError, ValueError):
        raise LabelDPError(f"{name} must be a number, got {epsilon!r}", code="invalid_epsilon") from None
    if not math.isfinite(value) or value <= 0:
        raise LabelDPError(f"{name} must be positive and finite, got {epsilon!r}", code="invalid_epsilon")
    return value


def design_epsilon(epsilon: float, margin: float = EXACT_MARGIN) -> float:
    """The ε to construct a mechanism at, so that its certified ε stays ≤ ``epsilon``."""
    return epsilon - margin * max(1.0, epsilon) if epsilon > 2 * margin else epsilon * (1 - 1e-3)


@dataclass(frozen=True)
class BudgetSplit:
    """ε = ε₁ (private label prior) + ε₂ (per-label randomizer); basic composition on the same labels."""

    epsilon: float
    prior_epsilon: float
    randomizer_epsilon: float
    rule: str


def split_budget(epsilon: float, num_labels: int, num_examples: int,
                 prior_epsilon: float | None = None) -> BudgetSplit:
    """Default rule (optimal-unbiased paper, App. C, after GKK+23): ε₁ = √(k/n), capped at ε/2.

    The paper's own choices follow it: census k=52, n≈1.3e7 gives ε₁≈0.002; Criteo k=400, n≈1.4e6 gives 0.017.
    The cap keeps most of a small budget for the labels themselves. ``prior_epsilon`` overrides the rule.
    """
    epsilon = check_epsilon(epsilon)
    if prior_epsilon is not None:
        prior_epsilon = check_epsilon(prior_epsilon, "prior epsilon (epsilon1)")
        if prior_epsilon >= epsilon:
            raise LabelDPError(f"prior epsilon {prior_epsilon} must be below the total epsilon {epsilon}",
                               code="invalid_epsilon")
        return BudgetSplit(epsilon, prior_epsilon, epsilon - prior_epsilon, "override")
    if num_labels < 1:
        raise LabelDPError("a prior needs at least one label value", code="invalid_domain")
    if num_examples <= 0:
        raise LabelDPError("cannot estimate a prior from zero labels", code="empty_labels")
    prior_epsilon = min(math.sqrt(num_labels / num_examples), epsilon / 2)
    return BudgetSplit(epsilon, prior_epsilon, epsilon - prior_epsilon, "sqrt(k/n) capped at epsilon/2")
