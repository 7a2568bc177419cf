"""Privacy parameters: the ε range this library certifies, validation, the design ε mechanisms are built at, and
the ε₁/ε₂ budget split."""

from __future__ import annotations

import math
from dataclasses import dataclass

from shared.errors import ErrorCode, LabelDPError

# Mechanisms are constructed at a design ε a hair below the requested one, so that rounding to the exactly
# sampled probabilities (≤ 2**-53 per entry) and LP solver tolerance can never push the certified ε above the
# request. The utility cost of the margin is of the same negligible order.
EXACT_MARGIN = 1e-9
SOLVER_MARGIN = 1e-6
# A randomizer that runs after a private prior is built at ε₂ = ε − ε₁ − COMPOSITION_MARGIN·ε, so that the charge
# recorded before either is drawn — the prior's exact ε₁ plus ε₂ — stays strictly inside the requested ε (an exact
# decimal, 10⁻⁹ units) after floating-point sums; 10⁻¹² of ε is far above their rounding and far below any utility.
COMPOSITION_MARGIN = 1e-12

# Every mechanism accepts every ε in [EPSILON_MIN, EPSILON_MAX] and either certifies it or refuses with a
# LabelDPError. Below 1e-6 the widest lattices' noise scales (10^6 steps / ε) leave exact int64 arithmetic;
# above 50 nothing is private in any useful sense (e^50 ≈ 5e21). A deployment narrows this range (the service's
# settings); the mechanisms never widen it.
EPSILON_MIN = 1e-6
EPSILON_MAX = 50.0

# Finite randomizers are sampled with probabilities on a 2**-53 grid. At ε = 16 their smallest probabilities
# (~e^-16 / |Y|) are still ~10^9 / |Y| grid units, so quantization cannot push the certified ε above the request;
# beyond it they would round to zero. Such randomizers are built at min(ε, 16): they are then within ~1e-7 of the
# identity, so nothing of utility is lost, and the certified ε they report (≤ 16) is what they guarantee.
SATURATION_EPSILON = 16.0


def check_epsilon(epsilon, name: str = "epsilon") -> float:
    """``epsilon`` as a float in [EPSILON_MIN, EPSILON_MAX], or a LabelDPError naming the problem."""
    try:
        value = float(epsilon)
    except (TypeError, ValueError, OverflowError):
        raise LabelDPError(f"{name} must be a number, got {epsilon!r}", code=ErrorCode.INVALID_EPSILON) from None
    if not math.isfinite(value) or value <= 0:
        raise LabelDPError(f"{name} must be positive and finite, got {epsilon!r}", code=ErrorCode.INVALID_EPSILON)
    if not EPSILON_MIN <= value <= EPSILON_MAX:
        raise LabelDPError(f"{name} must lie in [{EPSILON_MIN:g}, {EPSILON_MAX:g}], got {value!r}",
                           code=ErrorCode.EPSILON_OUT_OF_RANGE)
    return value


def design_epsilon(epsilon: float, margin: float = EXACT_MARGIN) -> float:
    """The ε to construct a finite randomizer at, so that its certified ε stays ≤ ``epsilon``: a relative margin
    below it (for the 2**-53 quantization and solver tolerances), and at most SATURATION_EPSILON."""
    target = min(epsilon, SATURATION_EPSILON)
    return target - margin * max(1.0, target)


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
                               code=ErrorCode.INVALID_EPSILON)
        return _checked_split(epsilon, prior_epsilon, "override")
    if num_labels < 1:
        raise LabelDPError("a prior needs at least one label value", code=ErrorCode.INVALID_DOMAIN)
    if num_examples <= 0:
        raise LabelDPError("cannot estimate a prior from zero labels", code=ErrorCode.EMPTY_LABELS)
    # (never below EPSILON_MIN: with 10^13 examples and two labels the rule would ask for less)
    prior_epsilon = max(min(math.sqrt(num_labels / num_examples), epsilon / 2), EPSILON_MIN)
    return _checked_split(epsilon, prior_epsilon, "sqrt(k/n) capped at epsilon/2")


def _checked_split(epsilon: float, prior_epsilon: float, rule: str) -> BudgetSplit:
    if epsilon - prior_epsilon < EPSILON_MIN:
        raise LabelDPError(f"epsilon {epsilon:g} leaves less than {EPSILON_MIN:g} for the randomizer after the prior's "
                           f"{prior_epsilon:g}", code=ErrorCode.EPSILON_OUT_OF_RANGE)
    return BudgetSplit(epsilon, prior_epsilon, epsilon - prior_epsilon - COMPOSITION_MARGIN * epsilon, rule)
