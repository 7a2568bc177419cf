"""What one privacy event costs each covered example: pure ε units, or its Rényi-DP curve (events with δ > 0)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from labels_party.ledger.units import UNITS_PER_EPSILON, charge_units, legacy_units

if TYPE_CHECKING:  # dp-accounting (and SciPy under it: 1.6 s) is imported where an event is read or accounted, so
    # that what only chains facts — making a key — starts fast (issue 42)
    from dp_accounting import dp_event

RDP_CAP = 10**18  # units per order beyond which an order never gives the minimum (sums saturate, never wrap)
UNBOUNDED = 2**62  # the spent units of a curve no δ can convert (δ = 0): admits nothing


@functools.cache
def rdp_orders() -> tuple[float, ...]:
    """dp-accounting's default orders; an account's curve is one int64 per order."""
    from dp_accounting.rdp import rdp_privacy_accountant

    return tuple(float(order) for order in rdp_privacy_accountant.RdpAccountant().orders)


def __getattr__(name: str):  # RDP_ORDERS, read when first used (PEP 562)
    if name == "RDP_ORDERS":
        return rdp_orders()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_gaussian(event: dp_event.DpEvent) -> bool:
    """An event with δ > 0 (accounted through its RDP curve)."""
    from dp_accounting import dp_event

    return isinstance(event, (dp_event.GaussianDpEvent, dp_event.PoissonSampledDpEvent,
                              dp_event.SelfComposedDpEvent))


def rdp_curve(event: dp_event.DpEvent) -> np.ndarray:
    """The event's RDP at :data:`RDP_ORDERS` in units, rounded up (one more unit than the float's ceiling, so the
    integer curve is never below the accountant's); infinite orders saturate at :data:`RDP_CAP`."""
    from dp_accounting.rdp import rdp_privacy_accountant

    accountant = rdp_privacy_accountant.RdpAccountant(orders=list(rdp_orders()))
    accountant.compose(event)
    curve = np.asarray(accountant.rdp, dtype=np.float64) * UNITS_PER_EPSILON
    finite = np.isfinite(curve) & (curve < RDP_CAP)
    return np.where(finite, np.ceil(np.where(finite, curve, 0.0)) + 1, RDP_CAP).astype(np.int64)


def rdp_epsilon_units(curves: np.ndarray, delta: float) -> np.ndarray:
    """ε (units, rounded up) of each row of summed curves at ``delta``; 0 for an empty curve, :data:`UNBOUNDED`
    where no finite ε exists (δ = 0)."""
    curves = np.atleast_2d(curves)
    out = np.zeros(curves.shape[0], dtype=np.int64)
    for row in np.flatnonzero(curves.any(axis=1)):
        epsilon = math.inf
        if delta > 0:
            from dp_accounting.rdp import rdp_privacy_accountant

            epsilon, _order = rdp_privacy_accountant.compute_epsilon(
                rdp_orders(), np.minimum(curves[row], RDP_CAP) / UNITS_PER_EPSILON, delta)
        out[row] = charge_units(epsilon) if math.isfinite(epsilon) and epsilon < UNBOUNDED / 1e9 else UNBOUNDED
    return out


@dataclass(frozen=True)
class Charge:
    """What one privacy event costs each example it covers, fixed before anything private is drawn: pure ε units,
    and the RDP curve of an event with δ > 0 (then ``units`` is 0)."""

    units: int
    rdp: tuple[int, ...] | None = None

    @classmethod
    def of(cls, event: dp_event.DpEvent, epsilon_requested: float) -> Charge:
        """A pure event is charged the requested ε (rounded up to a unit), which must bound the event's ε (the
        ledger checks it on the record, :meth:`Ledger.charge`); a Gaussian one its own curve, whatever ε was
        requested (the request only calibrated its noise)."""
        if is_gaussian(event):
            return cls(0, tuple(int(v) for v in rdp_curve(event)))
        return cls(charge_units(epsilon_requested))

    @classmethod
    def of_record(cls, record: dict) -> Charge:
        """The charge a stored record made — also records written before exact units (a float ``charge``) and
        before δ was budgeted (a Gaussian event charged as pure ε then; its curve now)."""
        if record.get("rdp_units") is not None:
            return cls(int(record.get("charge_units", 0)), tuple(int(v) for v in record["rdp_units"]))
        from shared.mechanisms import events

        event = events.from_dict(record["dp_event"]) if record.get("dp_event") else None
        if event is not None and is_gaussian(event):
            return cls(0, tuple(int(v) for v in rdp_curve(event)))
        units = int(record["charge_units"]) if "charge_units" in record else int(legacy_units(record["charge"]))
        return cls(units)

    @property
    def rdp_array(self) -> np.ndarray:
        """The RDP curve as an array (zeros for a pure charge)."""
        return np.asarray(self.rdp if self.rdp is not None else (0,) * len(rdp_orders()), dtype=np.int64)

    def standalone_units(self, delta: float) -> int:
        """This charge alone, as ε units at ``delta`` (what a release reports as its charged ε)."""
        if self.rdp is None:
            return self.units
        return self.units + int(rdp_epsilon_units(self.rdp_array, delta)[0])


def charged_units(record: dict) -> int:
    """What a stored record charged each covered example, as ε units on its own (an event with δ > 0: its ε at the
    recorded δ)."""
    return Charge.of_record(record).standalone_units(float(record.get("delta") or 0.0))
