"""The privacy-budget ledger: per-example accounting, charge-before-visible, and a hash-chained audit log.

Accounting model. Every release charges its ε to exactly the examples it covers. Releases are pure ε-DP in the
labels they cover, so an example's spent ε is the sum of the charges that cover it (basic composition, tight for
pure DP), and the dataset's spent ε is the maximum over examples (disjoint releases compose in parallel).
The per-example vector lives in a file that a committed dataset row points at; each charge writes a new vector
file and moves the pointer inside the same transaction that inserts the release and the ledger entry.

Each ledger record documents the event completely, in the spirit of dp-accounting's ``DpEvent``: mechanism and
parameters, requested and certified ε, the prior's noise, a ``dp_event`` built from dp-accounting's event classes
(``DiscreteLaplaceDpEvent`` for the prior, ``RandomizedResponseDpEvent``/``DiscreteLaplaceDpEvent`` for
mechanisms it knows, :class:`LocalRandomizerDpEvent` for the others) and the covered examples (count and
SHA-256 of their registry indices, stored in a coverage file). :func:`event_epsilon` recomputes ε from the
``dp_event`` alone.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

import attr
import numpy as np
from dp_accounting import dp_event

from labels_party.prior import HISTOGRAM_SENSITIVITY
from labels_party.storage import DataStore
from shared.errors import LabelDPError
from shared.mechanisms.integer_noise import DiscreteLaplace

# Float sums of ε (0.1 + 0.1 + ...) must not refuse the last legitimate release of an exactly divisible budget.
BUDGET_TOLERANCE = 1e-9


@attr.s(frozen=True, slots=True, auto_attribs=True)
class LocalRandomizerDpEvent(dp_event.DpEvent):
    """A local randomizer applied once to each covered label, pure ε-DP with ε = ``epsilon`` (its certified ε,
    computed from the exact sampled probabilities)."""

    mechanism: str
    epsilon: float


def mechanism_dp_event(mechanism) -> dp_event.DpEvent:
    name = mechanism.name
    if name == "rr":
        k = len(mechanism.input_values)
        e = math.exp(mechanism.certified_epsilon)
        return dp_event.RandomizedResponseDpEvent(noise_parameter=k / (e + k - 1), num_buckets=k)
    noise = getattr(mechanism, "noise", None)
    if isinstance(noise, DiscreteLaplace):  # laplace, clipped or not (clipping is post-processing)
        return dp_event.DiscreteLaplaceDpEvent(noise_parameter=noise.s / noise.t,
                                               sensitivity=int(mechanism.lattice.steps))
    return LocalRandomizerDpEvent(mechanism=name, epsilon=float(mechanism.certified_epsilon))


def prior_dp_event(prior) -> dp_event.DpEvent:
    """Histogram + discrete Laplace noise, ℓ1 sensitivity 2 under a label change."""
    return dp_event.DiscreteLaplaceDpEvent(noise_parameter=prior.noise.s / prior.noise.t,
                                           sensitivity=HISTOGRAM_SENSITIVITY)


def event_epsilon(event: dp_event.DpEvent, delta: float = 0.0) -> float:
    """ε of an event built here: pure-DP events add (basic composition); Gaussian (DP-SGD) events get their ε at
    the recorded δ from dp-accounting's RDP accountant."""
    if isinstance(event, dp_event.ComposedDpEvent):
        return sum(event_epsilon(e, delta) for e in event.events)
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
    if isinstance(event, LocalRandomizerDpEvent):
        return event.epsilon
    raise LabelDPError(f"no pure-ε rule for {type(event).__name__}", code="unsupported_event")


def event_to_dict(event: dp_event.DpEvent) -> dict:
    """JSON form: {"type": class name, fields...} recursively."""
    out = {"type": type(event).__name__}
    for field in attr.fields(type(event)):
        value = getattr(event, field.name)
        if isinstance(value, list):
            value = [event_to_dict(v) for v in value]
        elif isinstance(value, dp_event.DpEvent):
            value = event_to_dict(value)
        out[field.name] = value
    return out


def event_from_dict(data: dict) -> dp_event.DpEvent:
    data = dict(data)
    name = data.pop("type")
    cls = LocalRandomizerDpEvent if name == "LocalRandomizerDpEvent" else getattr(dp_event, name)
    if "events" in data:
        data["events"] = [event_from_dict(e) for e in data["events"]]
    if "event" in data and isinstance(data["event"], dict):  # SelfComposed / PoissonSampled wrap one event
        data["event"] = event_from_dict(data["event"])
    return cls(**data)


def canonical(record: dict) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False)


def chain_hash(prev_hash: str, record_json: str) -> str:
    return hashlib.sha256((prev_hash + record_json).encode()).hexdigest()


@dataclass(frozen=True)
class BudgetState:
    epsilon_total: float
    epsilon_spent: float

    @property
    def epsilon_remaining(self) -> float:
        return max(0.0, self.epsilon_total - self.epsilon_spent)


class BudgetExceeded(LabelDPError):
    code = "budget_exceeded"

    def __init__(self, message: str, remaining: float):
        super().__init__(message)
        self.remaining = remaining


class BudgetLedger:
    """Per-example budget vectors of one dataset, stored in :class:`DataStore` files."""

    def __init__(self, store: DataStore):
        self.store = store

    def spent_vector(self, dataset) -> np.ndarray:
        spent = np.zeros(dataset.registry_size)
        if dataset.spent_file:
            stored = self.store.read_array(dataset.spent_file)
            spent[: stored.size] = stored
        return spent

    def remaining_for(self, dataset, covered: np.ndarray) -> float:
        spent = self.spent_vector(dataset)
        worst = float(spent[covered].max()) if covered.size else 0.0
        return max(0.0, dataset.epsilon_total - worst)

    def charge(self, dataset, covered: np.ndarray, epsilon: float, record: dict) -> tuple[str, str, str]:
        """Check and charge ``epsilon`` to ``covered`` (registry indices). Caller holds the dataset row lock and
        commits. Returns (record json, prev hash, hash); mutates ``dataset`` (pointer, spent max, chain head)."""
        spent = self.spent_vector(dataset)
        worst = float(spent[covered].max()) if covered.size else 0.0
        if worst + epsilon > dataset.epsilon_total + BUDGET_TOLERANCE:
            remaining = max(0.0, dataset.epsilon_total - worst)
            raise BudgetExceeded(f"release needs epsilon {epsilon:g} but covered examples have at most "
                                 f"{remaining:.6g} left of {dataset.epsilon_total:g}", remaining)
        spent[covered] += epsilon
        seq = dataset.ledger_seq + 1
        coverage = np.sort(covered).astype(np.int64)
        coverage_file = self.store.write_array(f"datasets/{dataset.id}/coverage_{seq:08d}.npy", coverage)
        record = {**record, "seq": seq, "dataset_id": dataset.id, "charge": epsilon,
                  "examples_covered": int(coverage.size),
                  "coverage": {"file": coverage_file, "sha256": hashlib.sha256(coverage.tobytes()).hexdigest()},
                  "spent_max_after": float(spent.max()), "epsilon_total": dataset.epsilon_total,
                  "composition": "pure epsilon-DP events add per example; disjoint examples compose in parallel"}
        record_json = canonical(record)
        prev_hash = dataset.ledger_head
        digest = chain_hash(prev_hash, record_json)
        dataset.spent_file = self.store.write_array(f"datasets/{dataset.id}/spent_{seq:08d}.npy", spent)
        dataset.epsilon_spent = float(spent.max())
        dataset.ledger_seq = seq
        dataset.ledger_head = digest
        return record_json, prev_hash, digest


def verify_chain(entries, head: str | None = None) -> bool:
    """entries: (seq, record_json, prev_hash, hash) ordered by seq, for one dataset."""
    previous = "0" * 64
    for expected_seq, (seq, record_json, prev_hash, digest) in enumerate(entries, start=1):
        if seq != expected_seq or prev_hash != previous or chain_hash(prev_hash, record_json) != digest:
            return False
        if json.loads(record_json).get("seq") != seq:
            return False
        previous = digest
    return head is None or head == previous
