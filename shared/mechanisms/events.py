"""Privacy events: what each mechanism reports about itself for accounting, in dp-accounting's vocabulary.

Every mechanism object has a ``dp_event()``. Where dp-accounting has an event for it (randomized response, the
discrete Laplace, DP-SGD's Poisson-sampled Gaussian) that event is used; otherwise one of the two small classes
below, with the same contract: the event alone documents everything needed to recompute ε (:func:`epsilon_of`).
Composition is an event too: ``ComposedDpEvent`` (basic composition on the same labels: prior + randomizer) and
:class:`ParallelDpEvent` (disjoint groups of examples).
"""

from __future__ import annotations

import math

import attr
from dp_accounting import dp_event


@attr.s(frozen=True, slots=True, auto_attribs=True)
class LocalRandomizerDpEvent(dp_event.DpEvent):
    """A local randomizer applied once to each covered label, pure ε-DP with ε = ``epsilon``: its certified ε,
    computed from the exact probabilities it samples (an upper bound, never understated)."""

    mechanism: str
    epsilon: float


@attr.s(frozen=True, slots=True, auto_attribs=True)
class ExponentialMechanismDpEvent(dp_event.DpEvent):
    """One draw of the exponential mechanism among ``candidates`` outputs, pure ε-DP with ε = ``epsilon``: its
    certified ε from the exact rate it samples with (:mod:`shared.mechanisms.exponential`)."""

    epsilon: float
    candidates: int


@attr.s(frozen=True, slots=True, auto_attribs=True)
class AboveThresholdDpEvent(dp_event.DpEvent):
    """One AboveThreshold (sparse vector) sweep of ``candidates`` monotone counting queries of sensitivity 1 that
    stops at the first above a noisy threshold, pure ε-DP with ε = ``epsilon`` = the threshold's noise ε plus the
    queries' (Lyu, Su & Li, "Understanding the Sparse Vector Technique for Differential Privacy", VLDB 2017,
    Algorithm 7 with monotonic queries: each noise Laplace(Δ/ε_part)); certified from the exact discrete Laplace
    scales it samples."""

    epsilon: float
    candidates: int


@attr.s(frozen=True, slots=True, auto_attribs=True)
class ParallelDpEvent(dp_event.DpEvent):
    """Events on disjoint sets of examples (one per group): each example pays only its own group's, so the
    release's ε is the largest of them."""

    events: list[dp_event.DpEvent]


def epsilon_of(event: dp_event.DpEvent, delta: float = 0.0) -> float:
    """ε of an event built here: pure-DP events add under composition and take the maximum in parallel;
    Gaussian (DP-SGD) events get their ε at ``delta`` from dp-accounting's RDP accountant."""
    if isinstance(event, dp_event.ComposedDpEvent):
        return sum(epsilon_of(e, delta) for e in event.events)
    if isinstance(event, ParallelDpEvent):
        return max(epsilon_of(e, delta) for e in event.events)
    if isinstance(event, dp_event.SelfComposedDpEvent | dp_event.PoissonSampledDpEvent | dp_event.GaussianDpEvent):
        from dp_accounting import rdp

        accountant = rdp.RdpAccountant()
        accountant.compose(event)
        return float(accountant.get_epsilon(delta))
    if isinstance(event, dp_event.LaplaceDpEvent):
        return 1.0 / event.noise_multiplier
    if isinstance(event, dp_event.DiscreteLaplaceDpEvent):
        return event.noise_parameter * event.sensitivity
    if isinstance(event, dp_event.RandomizedResponseDpEvent):
        p, k = event.noise_parameter, event.num_buckets
        return math.log((1 - p + p / k) / (p / k))
    if isinstance(event, LocalRandomizerDpEvent | ExponentialMechanismDpEvent | AboveThresholdDpEvent):
        return event.epsilon
    raise ValueError(f"no ε rule for {type(event).__name__}")


def to_dict(event: dp_event.DpEvent) -> dict:
    """JSON form: {"type": class name, fields...} recursively."""
    out = {"type": type(event).__name__}
    for field in attr.fields(type(event)):
        value = getattr(event, field.name)
        if isinstance(value, list):
            value = [to_dict(v) for v in value]
        elif isinstance(value, dp_event.DpEvent):
            value = to_dict(value)
        out[field.name] = value
    return out


def from_dict(data: dict) -> dp_event.DpEvent:
    data = dict(data)
    name = data.pop("type")
    cls = {"LocalRandomizerDpEvent": LocalRandomizerDpEvent, "ParallelDpEvent": ParallelDpEvent,
           "ExponentialMechanismDpEvent": ExponentialMechanismDpEvent,
           "AboveThresholdDpEvent": AboveThresholdDpEvent}.get(name) or getattr(dp_event, name)
    if "events" in data:
        data["events"] = [from_dict(e) for e in data["events"]]
    if isinstance(data.get("event"), dict):  # SelfComposed / PoissonSampled wrap one event
        data["event"] = from_dict(data["event"])
    return cls(**data)
