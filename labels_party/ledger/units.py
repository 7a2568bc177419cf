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


def within_charge(epsilon: float, units: int) -> bool:
    """Is a recomputed ε (a double, e.g. an event's ε from its double parameters) within a charge of ``units``?
    Compared exactly in integer units: the double is read as the service reads every ε — its shortest decimal,
    rounded up to a unit (:func:`charge_units`) — so 0.1 computed as 0.1000000000000000055… is 100 000 000 units
    (not a false alarm against a charge of 0.1), and 0.1 + 0.2 = 0.30000000000000004 is 300 000 001."""
    return math.isfinite(epsilon) and charge_units(epsilon) <= units
