"""The release transaction, the same for every kind of release.

:func:`run` checks the request's ε against the deployment's range, then

1. **begin** — access, Idempotency-Key replay (a retry gets the stored release, never a second draw) and a
   snapshot of the current label version;
2. **cover** — the kind names the examples it covers (a list of ids, looked up in one pass over the label
   version, or the whole version, whose coverage set was stored at upload); unknown ids are refused and the budget
   is checked early (fail fast; not yet the exact check);
3. **compute** — the kind turns the covered labels into a :class:`Draft`, outside any transaction: nothing is
   visible yet (a whole version is read row group by row group: ``compute_version``, bounded memory);
4. **commit** — the release file is written, then one transaction under the dataset lock checks every covered
   example's budget exactly, charges it, appends the ledger record (built by the ledger from the draft's
   ``dp_event``), stores the public mechanism document and inserts the release. A crash leaves both or neither.

A release belongs to the organization that requested it: its idempotency key, its visibility and its download are
that organization's (and the dataset owner's admins').
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from labels_party import db, documents, labelstore
from labels_party.auth import Principal
from labels_party.ledger import Actor, canonical, charge_units, units_epsilon
from labels_party.service import ServiceContext, accessible_dataset, check_epsilon_range
from labels_party.solvers.deadline import Deadline
from shared import schemas
from shared.domains import domain_from_spec
from shared.errors import LabelDPError
from shared.mechanisms import events


@dataclass(frozen=True)
class Snapshot:
    """The dataset and its current label version, read once when the release begins (labels stay on disk)."""

    dataset: db.Dataset
    domain: object
    version: int
    file: str  # the label version (see labels_party.labelstore)
    num_examples: int
    coverage: labelstore.CoverageSet | None  # the whole version's; None for versions written before coverage sets
    legacy_registry: str | None = None

    def read(self, ctx: ServiceContext) -> Callable[[], Iterator[pa.RecordBatch]]:
        """The version's (example_id, label) row groups, re-readable."""
        return lambda: labelstore.iter_version(ctx.store, self.file, ("example_id", "label"), self.legacy_registry)


@dataclass(frozen=True)
class Draft:
    """What a release publishes and what it costs, computed but not yet visible."""

    privacy: Any  # certified_epsilon and dp_event(): a mechanism result
    columns: dict  # privatized labels, without example ids (empty for evaluations and central training)
    description: dict  # public; stored once in a mechanism document
    noisy_prior: dict | None = None
    prior_epsilon: float = 0.0
    delta: float = 0.0
    write: Callable[[Path], None] | None = None  # a streamed release writes its own file (then columns is empty)


@dataclass(frozen=True)
class Computation:
    """What a kind may use to compute its draft: the release's randomness and the solver deadline."""

    rng: np.random.Generator
    deadline: Deadline


class ReleaseKind(Protocol):
    """A kind of release, as a strategy: what it is, what it covers and how it computes its draft."""

    mechanism: str  # recorded wire name
    epsilon: float  # requested; charged rounded up to 10⁻⁹ to every covered example

    def epsilons(self) -> dict[str, float]:
        """Every ε of the request by its field name, each checked against the deployment's range."""

    def identity(self) -> dict:
        """The whole request as the Idempotency-Key binds it (bodies by their SHA-256)."""

    def record(self) -> dict:
        """The privacy parameters as the ledger records them (no example ids, features or predictions)."""

    def check(self) -> None:
        """Refusals that need only the request (before anything is read)."""

    def inputs(self, snapshot: Snapshot) -> tuple[Sequence[str] | None, Any]:
        """Refusals that need the dataset; (the example ids to cover, None for all; per-example inputs aligned
        with them)."""

    def compute(self, snapshot: Snapshot, labels: np.ndarray, inputs: Any, run: Computation) -> Draft:
        """The draft from the covered examples' labels (in the order of the ids)."""

    def compute_version(self, snapshot: Snapshot, read: Callable[[], Iterator[pa.RecordBatch]],
                        run: Computation) -> Draft:
        """Only for kinds whose ``inputs`` may cover the whole version (ids None): the draft from the version's
        row groups, in bounded memory; its ``write`` produces the release file."""


def run(ctx: ServiceContext, principal: Principal, dataset_id: str, idempotency_key: str | None,
        kind: ReleaseKind) -> tuple[schemas.Release, bool]:
    """(release, created): a retry with the same key and body returns the stored release unchanged."""
    for name, epsilon in kind.epsilons().items():
        check_epsilon_range(ctx, epsilon, name)
    kind.check()
    body_hash = hashlib.sha256(canonical(kind.identity()).encode()).hexdigest()
    stored, snapshot = _begin(ctx, principal, dataset_id, idempotency_key, body_hash)
    if stored is not None:
        return stored, False
    example_ids, inputs = kind.inputs(snapshot)
    computation = Computation(ctx.random_source(), Deadline(ctx.settings.solver_seconds))
    if example_ids is None:
        coverage = _whole_version(ctx, snapshot)
        _check_budget_early(ctx, snapshot, coverage, kind.epsilon)
        draft, output_ids = kind.compute_version(snapshot, snapshot.read(ctx), computation), None
    else:
        index, labels = labelstore.lookup(ctx.store, snapshot.file, example_ids, snapshot.legacy_registry)
        coverage = labelstore.coverage_of(ctx.store, snapshot.dataset.id, index)
        _check_budget_early(ctx, snapshot, coverage, kind.epsilon)
        draft, output_ids = kind.compute(snapshot, labels, inputs, computation), pa.array(example_ids, pa.string())
    return _commit(ctx, principal, idempotency_key, body_hash, snapshot, kind, coverage, draft, output_ids)


def release_view(release: db.Release) -> schemas.Release:
    return schemas.Release(
        id=release.id, dataset_id=release.dataset_id, mechanism=release.mechanism, epsilon=release.epsilon,
        charged_epsilon=units_epsilon(release.charge_units), certified_epsilon=release.certified_epsilon,
        prior_epsilon=release.prior_epsilon, randomizer_epsilon=release.randomizer_epsilon,
        num_examples=release.num_examples, label_version=release.label_version,
        created_at=release.created_at, idempotency_key=release.idempotency_key,
        mechanism_hash=release.mechanism_hash, description=json.loads(release.description_json),
        noisy_prior=json.loads(release.prior_json) if release.prior_json else None, state=release.state or "available",
        error=json.loads(release.error_json) if release.error_json else None)


def existing_release(session: Session, principal: Principal, dataset_id: str, key: str,
                      body_hash: str) -> db.Release | None:
    existing = session.scalar(select(db.Release).where(
        db.Release.dataset_id == dataset_id, db.Release.requester_org_id == principal.org_id,
        db.Release.idempotency_key == key))
    if existing is not None and existing.body_hash != body_hash:
        raise LabelDPError("this Idempotency-Key was already used with a different request body",
                           code="idempotency_conflict")
    return existing


def _begin(ctx: ServiceContext, principal: Principal, dataset_id: str, idempotency_key: str | None,
           body_hash: str) -> tuple[schemas.Release | None, Snapshot | None]:
    """Access, idempotency and the label snapshot: (stored release to return, None) or (None, snapshot)."""
    if not idempotency_key or len(idempotency_key) > 200:
        raise LabelDPError("an Idempotency-Key header (1-200 characters) is required for releases",
                           code="idempotency_key_required")
    with ctx.sessions() as session, session.begin():
        dataset = accessible_dataset(session, principal, dataset_id)
        existing = existing_release(session, principal, dataset_id, idempotency_key, body_hash)
        if existing is not None:
            return release_view(existing), None
        if dataset.source_uri is not None:
            raise LabelDPError("a source dataset takes label releases of all its rows (POST .../releases) only",
                               code="source_dataset")
        version = session.scalar(select(db.LabelVersion).where(
            db.LabelVersion.dataset_id == dataset_id, db.LabelVersion.version == dataset.label_version))
        if version is None:
            raise LabelDPError("the dataset has no labels yet", code="no_labels")
    coverage = (labelstore.CoverageSet(version.coverage_file, version.coverage_sha256, version.num_examples)
                if version.coverage_file else None)
    return None, Snapshot(dataset, domain_from_spec(json.loads(dataset.domain_json)), version.version, version.file,
                          version.num_examples, coverage, dataset.registry_file)


def _whole_version(ctx: ServiceContext, snapshot: Snapshot) -> labelstore.CoverageSet:
    if snapshot.coverage is not None:
        return snapshot.coverage
    chunks = (b.column("registry_index").to_numpy() for b in
              labelstore.iter_version(ctx.store, snapshot.file, ("registry_index",), snapshot.legacy_registry))
    return labelstore.write_coverage(ctx.store, snapshot.dataset.id, chunks, total=snapshot.num_examples)


def _check_budget_early(ctx: ServiceContext, snapshot: Snapshot, coverage: labelstore.CoverageSet,
                        epsilon: float) -> None:
    """Fail fast before the computation; the exact check runs again under the lock when committing."""
    with ctx.sessions() as session, session.begin():
        dataset = session.get(db.Dataset, snapshot.dataset.id)
        try:
            remaining = ctx.ledger.remaining_units_for(dataset, labelstore.read_coverage(ctx.store, coverage.file))
        except FileNotFoundError:  # a concurrent charge superseded the state just read: leave it to the commit
            return
    if charge_units(epsilon) > remaining:
        raise _budget_error(epsilon, units_epsilon(remaining))


def _commit(ctx: ServiceContext, principal: Principal, idempotency_key: str, body_hash: str, snapshot: Snapshot,
            kind: ReleaseKind, coverage: labelstore.CoverageSet, draft: Draft,
            example_ids: pa.Array | None) -> tuple[schemas.Release, bool]:
    """Write the file, then check-charge-insert in one transaction under the dataset lock."""
    dataset_id, release_id = snapshot.dataset.id, db.new_id()
    relative = f"releases/{release_id}.parquet"
    file = (ctx.store.write_with(relative, draft.write) if draft.write is not None else
            ctx.store.write_table(relative, pa.table({"example_id": example_ids, **draft.columns})))
    superseded: list[str] = []
    try:
        with ctx.sessions() as session, session.begin():
            dataset = accessible_dataset(session, principal, dataset_id, lock=True)
            existing = existing_release(session, principal, dataset_id, idempotency_key, body_hash)
            if existing is not None:  # a concurrent retry won the race
                ctx.store.remove(file)
                return release_view(existing), False
            release = charge_and_insert(ctx, session, principal, dataset, snapshot, kind, coverage, draft,
                                         db.Release(id=release_id, idempotency_key=idempotency_key,
                                                    body_hash=body_hash, file=file), superseded)
            ctx.checkpoint("before_commit")
        ctx.checkpoint("after_commit")
    except IntegrityError:
        ctx.store.remove(file)
        with ctx.sessions() as session, session.begin():
            existing = existing_release(session, principal, dataset_id, idempotency_key, body_hash)
            if existing is None:
                raise
            return release_view(existing), False
    except LabelDPError as err:
        ctx.store.remove(file)
        if err.code == "budget_exceeded":
            raise _budget_error(kind.epsilon, err.remaining) from None
        raise
    except BaseException:  # nothing references the file unless the transaction committed
        ctx.store.remove(file)
        raise
    for old in superseded:  # budget files older than the state the commit replaced; best effort
        try:
            ctx.store.remove(old)
        except OSError:
            pass
    return release_view(release), True


def charge_and_insert(ctx: ServiceContext, session: Session, principal: Principal, dataset: db.Dataset,
                       snapshot: Snapshot, kind: ReleaseKind, coverage: labelstore.CoverageSet, draft: Draft,
                       release: db.Release, superseded: list[str]) -> db.Release:
    """Inside the locked transaction: the exact charge and its ledger record, the mechanism document, the
    release row."""
    mechanism_hash = documents.store(session, {"description": draft.description, "noisy_prior": draft.noisy_prior})
    units = charge_units(kind.epsilon)
    record, record_json, prev_hash, digest, replaced = ctx.ledger.charge(dataset, coverage, units, {
        "release_id": release.id, "created_at": db.utcnow().isoformat(),
        "actor": Actor(org=principal.org_name, role=principal.role), "mechanism": kind.mechanism,
        "request": kind.record(), "label_version": snapshot.version, "epsilon_requested": kind.epsilon,
        "epsilon_certified": draft.privacy.certified_epsilon, "delta": draft.delta,
        "dp_event": events.to_dict(draft.privacy.dp_event()), "mechanism_hash": mechanism_hash})
    release.dataset_id, release.requester_org_id, release.mechanism = dataset.id, principal.org_id, kind.mechanism
    release.epsilon, release.charge_units, release.certified_epsilon = kind.epsilon, units, record.epsilon_certified
    release.prior_epsilon, release.randomizer_epsilon = draft.prior_epsilon, kind.epsilon - draft.prior_epsilon
    superseded.extend(replaced)
    release.num_examples, release.label_version = coverage.size, snapshot.version
    release.description_json = json.dumps(documents.summary(draft.description))
    release.prior_json = json.dumps(documents.summary(draft.noisy_prior)) if draft.noisy_prior else None
    release.mechanism_hash = mechanism_hash
    session.add(release)
    session.add(db.LedgerEntry(dataset_id=dataset.id, seq=record.seq, release_id=release.id, record=record_json,
                               prev_hash=prev_hash, hash=digest))
    session.flush()
    return release


def _budget_error(epsilon: float, remaining: float) -> LabelDPError:
    error = LabelDPError(f"budget exceeded: this release needs epsilon {epsilon:g}, the covered examples have "
                         f"{remaining:.9g} left", code="budget_exceeded")
    error.remaining = remaining
    return error
