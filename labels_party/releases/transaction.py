"""The release transaction, the same for every kind of release: nothing private is drawn before it is paid for.

:func:`run` checks the request's ε against the deployment's range, then

1. **begin** — access, and the Idempotency-Key: a key already used by this organization on this dataset returns
   that request's outcome (waiting while it is still computed), never a new draw; a key used with another body
   is a 409 — before anything is computed for this request;
2. **cover** — the kind names the examples it covers (a list of ids, looked up in one pass over the label
   version, or the whole version, whose coverage set was stored at upload); unknown ids are refused;
3. **price** — the kind decides, from public inputs only, everything that can refuse the request (mechanism,
   domain, options, solver limits, ε split) and what it costs: its ``dp_event``;
4. **charge** — one transaction under the dataset lock reserves the key, checks the organization's account
   exactly and charges it, appends the ledger record and inserts the release ``running``. Only after it
   commits is any private quantity (a noisy prior, a privatized label, a noisy loss, a trained parameter) drawn;
5. **compute** — outside any transaction, the kind turns the covered labels into a :class:`Draft` (it never
   refuses: a solve that cannot certify falls back deterministically, see :mod:`labels_party.registry`);
6. **finish** — the release file is written, then one transaction stores the public mechanism document and makes
   the release ``available``. If anything fails after the charge — a crash, a full disk — the release is
   ``failed`` and stays charged; its outcome says nothing about the data (503 ``release_failed``).

A release belongs to the organization that requested it: its idempotency key, its visibility and its download are
that organization's (and the dataset owner's admins').
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
from dp_accounting import dp_event
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from labels_party import budgets, db, documents, labelstore
from labels_party.access import Admission, admitted_dataset, is_owner
from labels_party.auth import Principal
from labels_party.context import ServiceContext, check_epsilon_range
from labels_party.ledger import Actor, BudgetExceeded, RecordFields, canonical, units_epsilon
from labels_party.recovery import FAILED
from labels_party.solvers.deadline import Deadline
from shared import schemas
from shared.domains import domain_from_spec
from shared.errors import LabelDPError

log = logging.getLogger(__name__)
POLL_SECONDS = 0.1  # how often a request waits for the outcome of another one with its key
OUTCOME_WAIT_SECONDS = 2.0  # how long it waits at most (a worker thread each: many waiters must not starve others)


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
    delta: float = 0.0  # the requesting organization's δ allocation on the dataset (events with δ > 0 need one)

    def read(self, ctx: ServiceContext) -> Callable[[], Iterator[pa.RecordBatch]]:
        """The version's (example_id, label) row groups, re-readable."""
        return lambda: labelstore.iter_version(ctx.store, self.file, ("example_id", "label"), self.legacy_registry)


class Priced(Protocol):
    """What a kind's ``price`` returns: the event the release is charged (its ε is recomputable and at most the
    charge) and the ε₁ it spends on a private prior; the kind's own preparation travels with it to ``compute``."""

    prior_epsilon: float

    def dp_event(self) -> dp_event.DpEvent: ...


@dataclass(frozen=True)
class Draft:
    """What a release publishes, computed after the charge and not yet visible."""

    privacy: Any  # certified_epsilon and dp_event(): what was actually built (at most what was charged)
    columns: dict  # privatized labels, without example ids (empty for evaluations and central training)
    description: dict  # public; stored once in a mechanism document
    noisy_prior: dict | None = None
    write: Callable[[Path], None] | None = None  # a streamed release writes its own file (then columns is empty)


@dataclass(frozen=True)
class Computation:
    """What a kind may use to compute its draft: the release's randomness and the solver deadline."""

    rng: np.random.Generator
    deadline: Deadline


class ReleaseKind(Protocol):
    """A kind of release, as a strategy: what it is, what it covers, what it costs and how it computes."""

    mechanism: str  # recorded wire name
    epsilon: float  # requested; a pure event is charged this, rounded up to 10⁻⁹, on every covered example

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

    def price(self, ctx: ServiceContext, snapshot: Snapshot, num_examples: int, inputs: Any) -> Priced:
        """Every remaining refusal, from public inputs only, and the event the release is charged."""

    def compute(self, snapshot: Snapshot, labels: np.ndarray, inputs: Any, priced: Priced,
                run: Computation) -> Draft:
        """The draft from the covered examples' labels (in the order of the ids); never refuses."""

    def compute_version(self, snapshot: Snapshot, read: Callable[[], Iterator[pa.RecordBatch]], priced: Priced,
                        run: Computation) -> Draft:
        """Only for kinds whose ``inputs`` may cover the whole version (ids None): the draft from the version's
        row groups, in bounded memory; its ``write`` produces the release file."""


def run(ctx: ServiceContext, admission: Admission, idempotency_key: str | None,
        kind: ReleaseKind) -> tuple[schemas.Release, bool]:
    """(release, created): a retry with the same key and body returns the stored release unchanged."""
    principal = admission.principal
    for name, epsilon in kind.epsilons().items():
        check_epsilon_range(ctx, epsilon, name)
    kind.check()
    key = checked_key(idempotency_key)
    body_hash = body_hash_of(kind)
    begun = _begin(ctx, admission, key, body_hash)
    if isinstance(begun, str):
        return outcome(ctx, principal, begun), False
    snapshot = begun
    example_ids, inputs = kind.inputs(snapshot)
    if example_ids is None:
        coverage, labels, output_ids = _whole_version(ctx, snapshot), None, None
    else:
        index, labels = labelstore.lookup(ctx.store, snapshot.file, example_ids, snapshot.legacy_registry)
        coverage, output_ids = labelstore.coverage_of(ctx.store, snapshot.dataset.id, index), example_ids
    priced = kind.price(ctx, snapshot, coverage.size, inputs)
    release_id, fresh = charge(ctx, principal, snapshot, kind, priced, coverage, key, body_hash, suffix=".parquet")
    if not fresh:  # a concurrent request with this key was charged first
        return outcome(ctx, principal, release_id), False
    computation = Computation(ctx.random_source(), Deadline(ctx.settings.solver_seconds))
    file = None
    try:
        if labels is None:
            draft = kind.compute_version(snapshot, snapshot.read(ctx), priced, computation)
        else:
            draft = kind.compute(snapshot, labels, inputs, priced, computation)
        file = _write(ctx, release_id, draft, output_ids)
        return finish(ctx, release_id, draft), True
    except BaseException as err:
        fail(ctx, release_id, file)
        if not isinstance(err, Exception):  # a process going down: the startup sweep records it as failed
            raise
        log.exception("release %s failed after it was charged", release_id)
        raise release_failed(release_id) from None


def checked_key(idempotency_key: str | None) -> str:
    if not idempotency_key or len(idempotency_key) > 200:
        raise LabelDPError("an Idempotency-Key header (1-200 characters) is required for releases",
                           code="idempotency_key_required")
    return idempotency_key


def body_hash_of(kind: ReleaseKind) -> str:
    return hashlib.sha256(canonical(kind.identity()).encode()).hexdigest()


def release_view(release: db.Release) -> schemas.Release:
    return schemas.Release(
        id=release.id, dataset_id=release.dataset_id, mechanism=release.mechanism, epsilon=release.epsilon,
        charged_epsilon=units_epsilon(release.charge_units), certified_epsilon=release.certified_epsilon,
        prior_epsilon=release.prior_epsilon, randomizer_epsilon=release.randomizer_epsilon,
        num_examples=release.num_examples, label_version=release.label_version,
        created_at=release.created_at, idempotency_key=release.idempotency_key,
        mechanism_hash=release.mechanism_hash, description=json.loads(release.description_json or "{}"),
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


def release_failed(release_id: str) -> LabelDPError:
    return LabelDPError(f"release {release_id} was charged before it was computed and could not be completed; it "
                        "stays charged and failed. Send a new request with a new Idempotency-Key to try again",
                        code="release_failed")


def outcome(ctx: ServiceContext, principal: Principal, release_id: str) -> schemas.Release:
    """The release a key stands for, once it is no longer being computed: its view, or the failure it ended in.
    Waits a few seconds at most — a waiting request holds a worker thread — then 409 ``release_in_progress``:
    the client sends it again later (the features party's client does, polling)."""
    deadline = time.monotonic() + OUTCOME_WAIT_SECONDS
    while True:
        with ctx.sessions() as session, session.begin():
            release = session.get(db.Release, release_id)  # this key's organization's: its key found it
            dataset = session.get(db.Dataset, release.dataset_id)
            state, view = release.state, release_view(release)
        if state == "available" or dataset.source_uri is not None:  # a source release is a job: its state is news
            return view
        if state == "failed":
            raise release_failed(release_id)
        if time.monotonic() > deadline:
            raise LabelDPError("a request with this Idempotency-Key is still being computed; send it again later",
                               code="release_in_progress")
        time.sleep(POLL_SECONDS)


def _begin(ctx: ServiceContext, admission: Admission, key: str, body_hash: str) -> Snapshot | str:
    """Idempotency and the label snapshot: the id of the release this key already stands for, or the snapshot to
    release from."""
    principal = admission.principal
    with ctx.sessions() as session, session.begin():
        dataset = admitted_dataset(session, admission)
        dataset_id = dataset.id
        existing = existing_release(session, principal, dataset_id, key, body_hash)
        if existing is not None:
            return existing.id
        if dataset.source_uri is not None:
            raise LabelDPError("a source dataset takes label releases of all its rows (POST .../releases) only",
                               code="source_dataset")
        version = session.scalar(select(db.LabelVersion).where(
            db.LabelVersion.dataset_id == dataset_id, db.LabelVersion.version == dataset.label_version))
        if version is None:
            raise LabelDPError("the dataset has no labels yet", code="no_labels")
        account = budgets.account_of(session, dataset, principal.org_id)
    coverage = (labelstore.CoverageSet(version.coverage_file, version.coverage_sha256, version.num_examples)
                if version.coverage_file else None)
    return Snapshot(dataset, domain_from_spec(json.loads(dataset.domain_json)), version.version, version.file,
                    version.num_examples, coverage, dataset.registry_file, account.delta if account else 0.0)


def _whole_version(ctx: ServiceContext, snapshot: Snapshot) -> labelstore.CoverageSet:
    if snapshot.coverage is not None:
        return snapshot.coverage
    chunks = (b.column("registry_index").to_numpy() for b in
              labelstore.iter_version(ctx.store, snapshot.file, ("registry_index",), snapshot.legacy_registry))
    return labelstore.write_coverage(ctx.store, snapshot.dataset.id, chunks, total=snapshot.num_examples)


def charge(ctx: ServiceContext, principal: Principal, snapshot: Snapshot, kind: ReleaseKind, priced: Priced,
           coverage: labelstore.CoverageSet, key: str, body_hash: str, *, suffix: str) -> tuple[str, bool]:
    """Reserve the key and charge the release in one transaction under the dataset lock: (release id, True), or
    (the id of the release a concurrent request with this key was charged for, False). Nothing private has been
    drawn yet; from the commit on, the release is paid whatever happens. Its labels will be ``releases/{id}``
    + ``suffix``."""
    dataset_id, release_id = snapshot.dataset.id, db.new_id()
    superseded: tuple[str, ...] = ()
    try:
        with ctx.sessions() as session, session.begin():
            # The dataset's lock first (the ledger takes it too): a concurrent request on this key waits here and
            # then finds this one's release, instead of charging and losing the key's unique constraint.
            session.get(db.Dataset, dataset_id, with_for_update=True)
            existing = existing_release(session, principal, dataset_id, key, body_hash)
            if existing is not None:
                return existing.id, False
            try:
                charged = ctx.ledger.charge(
                    session, dataset_id, principal.org_id, coverage, priced.dp_event(), kind.epsilon, RecordFields(
                        release_id=release_id, created_at=db.utcnow().isoformat(),
                        actor=Actor(org=principal.org_name, role=principal.role), mechanism=kind.mechanism,
                        request=kind.record(), label_version=snapshot.version))
            except BudgetExceeded as err:
                raise err.told_to(is_owner(principal, snapshot.dataset)) from None
            superseded = charged.superseded
            session.add(db.Release(
                id=release_id, dataset_id=dataset_id, requester_org_id=principal.org_id, idempotency_key=key,
                body_hash=body_hash, mechanism=kind.mechanism, epsilon=kind.epsilon,
                charge_units=charged.standalone_units, certified_epsilon=None,
                prior_epsilon=priced.prior_epsilon, randomizer_epsilon=kind.epsilon - priced.prior_epsilon,
                num_examples=coverage.size, label_version=snapshot.version, description_json="{}",
                file=f"releases/{release_id}{suffix}", state="running"))
            session.flush()
            ctx.checkpoint("before_charge_commit")
    except IntegrityError:  # the key's unique constraint: a concurrent request got there first
        with ctx.sessions() as session, session.begin():
            existing = existing_release(session, principal, dataset_id, key, body_hash)
            if existing is None:
                raise
            return existing.id, False
    try:  # under the dataset's lock: a later charge's pending anchor is never overwritten by this older head
        with ctx.sessions() as session, session.begin():
            ctx.ledger.confirm(session.get(db.Dataset, dataset_id, with_for_update=True))
    except (OSError, SQLAlchemyError):  # the pending anchor stands: a restore one charge old is not told apart
        log.warning("could not confirm the ledger anchor of dataset %s", dataset_id)
    try:  # charged: from here on a failure is the release's, paid for
        ctx.checkpoint("after_charge_commit")
    except Exception:
        fail(ctx, release_id, None)
        log.exception("release %s failed after it was charged", release_id)
        raise release_failed(release_id) from None
    for old in superseded:  # budget files older than the state the commit replaced; best effort
        try:
            ctx.store.remove(old)
        except OSError:
            pass
    return release_id, True


def _write(ctx: ServiceContext, release_id: str, draft: Draft, example_ids: Sequence[str] | None) -> str:
    with ctx.sessions() as session, session.begin():
        relative = session.get(db.Release, release_id).file
    if draft.write is not None:
        return ctx.store.write_with(relative, draft.write)
    return ctx.store.write_table(relative, pa.table({"example_id": pa.array(example_ids, pa.string()),
                                                     **draft.columns}))


def finish(ctx: ServiceContext, release_id: str, draft: Draft, *, state: str = "available") -> schemas.Release:
    """Store the public mechanism document and make the release ``state`` (available; a job's: running)."""
    with ctx.sessions() as session, session.begin():
        release = session.get(db.Release, release_id, with_for_update=True)
        if release.state != "running":
            raise LabelDPError(f"release {release_id} is {release.state}", code="release_failed")
        release.mechanism_hash = documents.store(session, {"description": draft.description,
                                                           "noisy_prior": draft.noisy_prior})
        release.certified_epsilon = draft.privacy.certified_epsilon
        release.description_json = json.dumps(documents.summary(draft.description))
        release.prior_json = json.dumps(documents.summary(draft.noisy_prior)) if draft.noisy_prior else None
        release.state = state
        session.flush()
        ctx.checkpoint("before_finish_commit")
        view = release_view(release)
    ctx.checkpoint("after_finish_commit")
    return view


def fail(ctx: ServiceContext, release_id: str, file: str | None) -> None:
    """A charged release that could not be completed: failed, charged, no file. Only a release still running
    fails (one that became available keeps its labels); if the database is gone too, the startup sweep does it."""
    failed = False
    try:
        with ctx.sessions() as session, session.begin():
            release = session.get(db.Release, release_id, with_for_update=True)
            if release.state == "running":
                release.state, release.error_json = "failed", json.dumps(FAILED)
                file, failed = file or release.file, True
    except Exception:  # noqa: BLE001 - the original failure is what the caller reports
        log.exception("could not record release %s as failed", release_id)
    if failed and file is not None:
        try:
            ctx.store.remove(file)
        except OSError:
            pass
