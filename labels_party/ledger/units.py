"""Exact ε units (10⁻⁹ ε), the one remaining-budget computation, and the comparison of a recomputed ε with a
charge."""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

import numpy as np

UNITS_PER_EPSILON = 10**9


def charge_units(epsilon: float) -> int:
    """ε as charged: the decimal the client sent, rounded up to a unit of 10⁻⁹."""
    return _units(epsilon, ROUND_CEILING)


def budget_units(epsilon: float) -> int:
    """A budget: the decimal the owner sent, rounded down to a unit."""
    return _units(epsilon, ROUND_FLOOR)


def _units(epsilon: float, rounding: str) -> int:
    return int((Decimal(repr(float(epsilon))) * UNITS_PER_EPSILON).to_integral_value(rounding=rounding))


def units_epsilon(units: int) -> float:
    """Units as the nearest double (integer division is correctly rounded: 300000000 units print as 0.3)."""
    return int(units) / UNITS_PER_EPSILON


def remaining_units(allocation_units: int, spent_units: int) -> int:
    """What an allocation has left once ``spent_units`` are spent: the one place remaining budget is computed."""
    return max(0, int(allocation_units) - int(spent_units))


def budget_figures(allocation_units: int, spent_units: int, delta: float) -> dict[str, float]:
    """An allocation as the API shows it: decimal ε from exact units (0.1 + 0.2 spent of 0.3 reads 0.3 and
    leaves exactly 0), and its δ."""
    return {"epsilon_total": units_epsilon(allocation_units), "epsilon_spent": units_epsilon(spent_units),
            "epsilon_remaining": units_epsilon(remaining_units(allocation_units, spent_units)), "delta_total": delta}


def legacy_units(spent: float | np.ndarray):
    """Float ε sums written before exact accounting, as units: rounded to 10⁻³ of a unit to shed the float noise of
    the sum (2.8559999999997965 for 2856 × 0.001), then up — a budget can only look more spent, never less."""
    return np.ceil(np.round(np.asarray(spent, dtype=np.float64) * UNITS_PER_EPSILON, 3)).astype(np.int64)


# An ε recomputed from an event's double parameters (a noise scale s/t as a double, times a sensitivity) may exceed
# the exact rational the mechanism was calibrated to by a few units in the last place; this relative slack absorbs
# that and nothing more: at ε ≤ 50 it is below 3·10⁻¹² absolute, far below one unit (10⁻⁹).
RECOMPUTATION_SLACK = Decimal(2) ** -44


def within_charge(epsilon: float, units: int) -> bool:
    """Is a recomputed ε (a float) at most the charged units (up to :data:`RECOMPUTATION_SLACK`)?"""
    return math.isfinite(epsilon) and Decimal(epsilon) * UNITS_PER_EPSILON * (1 - RECOMPUTATION_SLACK) <= units
