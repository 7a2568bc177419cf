"""A release row's life and the types a release is computed with.

A release is inserted ``running`` by the charge (:func:`labels_party.releases.transaction.charge`), and then becomes
``available`` (:func:`finish`: its mechanism document stored; a source dataset's release stays ``running`` until its
Spark job — a durable job, :mod:`labels_party.runtime.jobs` — wrote the labels) or ``failed`` (:func:`fail`: charged,
its file removed). An uploaded dataset's release is computed under a lease (:mod:`.liveness`): both record its
outcome only while the request still holds it. Nothing here decides access or charges anything.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa
from dp_accounting import dp_event
from sqlalchemy import select
from sqlalchemy.orm import Session

from labels_party.core.solvers.deadline import Deadline
from labels_party.http.auth import Principal
from labels_party.ledger import documents, units_epsilon
from labels_party.releases import liveness
from labels_party.releases.privatization import seal
from labels_party.runtime.context import ServiceContext
from labels_party.runtime.jobs import INTERRUPTED
from labels_party.store import db, labelstore
from shared import schemas
from shared.domains import Domain
from shared.errors import ErrorCode, LabelDPError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    """The dataset and its current label version, read once when the release begins (labels stay on disk)."""

    dataset: db.Dataset
    domain: Domain
    version: int
    file: str  # the label version (see labels_party.store.labelstore)
    num_examples: int
    coverage: labelstore.CoverageSet  # the whole version's (a source dataset: all its rows)
    delta: float = 0.0  # the requesting organization's δ allocation on the dataset (events with δ > 0 need one)
    id_bytes: int = 0  # Σ of its ids' UTF-8 bytes (the version's, or the source's as registered): storage estimates

    def read(self, ctx: ServiceContext) -> Callable[[], Iterator[pa.RecordBatch]]:
        """The version's (example_id, label) row groups, re-readable; each pass refused at its end unless its rows
        were the examples the release was charged for (:func:`labelstore.iter_charged`)."""
        return lambda: labelstore.iter_charged(ctx.store, self.file, self.coverage)


class Priced(Protocol):
    """What a kind's ``price`` returns: the event the release is charged (its ε is recomputable and at most the
    charge) and the ε₁ it spends on a private prior; the kind's own preparation travels with it to ``compute``."""

    @property
    def prior_epsilon(self) -> float: ...

    def dp_event(self) -> dp_event.DpEvent: ...


P = TypeVar("P", bound=Priced)


class Certified(Protocol):
    """What a computed release certifies: the ε of what was actually built (at most what was charged)."""

    @property
    def certified_epsilon(self) -> float: ...


@dataclass(frozen=True)
class Draft:
    """What a release publishes, computed after the charge and not yet visible."""

    privacy: Certified
    columns: dict  # privatized labels, without example ids (empty for evaluations and central training)
    description: dict  # public; stored once in a mechanism document
    noisy_prior: dict | None = None
    write: Callable[[Path], None] | None = None  # a streamed release writes its own file (then columns is empty)


@dataclass(frozen=True)
class Computation:
    """What a kind may use to compute its draft: the release's randomness and the solver deadline."""

    rng: np.random.Generator
    deadline: Deadline


class ReleaseKind(Protocol[P]):
    """A kind of release, as a strategy: what it is, what it covers, what it costs (``P``, its priced plan) and
    how it computes."""

    @property
    def mechanism(self) -> str:
        """The recorded wire name."""

    @property
    def epsilon(self) -> float:
        """Requested; a pure event is charged this, rounded up to 10⁻⁹, on every covered example."""

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

    def covers(self, inputs: Any) -> np.ndarray | None:
        """Which of the ids ``inputs`` named the release covers — charges and releases — as a boolean mask over
        them (None: all of them), decided from those public inputs alone before the coverage is computed; the
        others are checked like them (known, not repeated) and left out, neither charged nor released."""

    def price(self, ctx: ServiceContext, snapshot: Snapshot, num_examples: int, inputs: Any) -> P:
        """Every remaining refusal, from public inputs only, and the event the release is charged."""

    def compute(self, snapshot: Snapshot, labels: np.ndarray, inputs: Any, priced: P, run: Computation) -> Draft:
        """The draft from the covered examples' labels (in the order of the ids); never refuses."""

    def compute_version(self, snapshot: Snapshot, read: Callable[[], Iterator[pa.RecordBatch]], priced: P,
                        run: Computation) -> Draft:
        """Only for kinds whose ``inputs`` may cover the whole version (ids None): the draft from the version's
        row groups, in bounded memory; its ``write`` produces the release file."""


@dataclass(frozen=True)
class Covered:
    """What a release covers, decided before it is priced: the coverage set (charged), the covered examples'
    labels in the order of ``example_ids`` (None when the completion reads them itself), the kind's per-example
    inputs, and what the completion plans from (a source's stored counts)."""

    coverage: labelstore.CoverageSet
    example_ids: Sequence[str] | None = None
    labels: np.ndarray | None = None
    inputs: Any = None
    counts: Any = None


class Completion(Protocol):
    """The commit order's strategy: how a release is covered before its charge, and completed after it.

    Both completions charge in the same transaction (:func:`~.transaction.charge`) before anything private is
    drawn; they differ in what follows: :data:`~.transaction.IN_PROCESS` computes the draft in this request and
    answers 201 with the release ``available``; a source dataset's (:data:`~.source.SPARK_JOB`) plans from the
    counts taken at registration, writes the job and answers 202 with the release ``running`` until its Spark job
    wrote the labels."""

    @property
    def suffix(self) -> str:
        """Of the release's file: ``releases/{id}{suffix}``."""

    def cover(self, ctx: ServiceContext, snapshot: Snapshot, kind: ReleaseKind[Any]) -> Covered:
        """Refusals that need the dataset (before the charge) and what the release covers."""

    def check(self, snapshot: Snapshot, priced: Priced) -> None:
        """Refusals the priced plan decides (public inputs only)."""

    def complete(self, ctx: ServiceContext, release_id: str, snapshot: Snapshot, kind: ReleaseKind[Any],
                 covered: Covered, priced: Priced) -> schemas.Release:
        """After the charge: what the release publishes; raises only for failures, never to refuse."""

    def abandon(self, ctx: ServiceContext, release_id: str) -> None:
        """Remove what :meth:`complete` left when it failed (the release is already ``failed``)."""

    def replayed(self, ctx: ServiceContext, session: Session, release: db.Release) -> bool:
        """The release an earlier request with this key was charged for: whether to run it again (the same charge
        and noise); :meth:`restart` then does, after the commit."""

    def restart(self, ctx: ServiceContext, release_id: str) -> None: ...

    @property
    def waits(self) -> bool:
        """Whether a replay waits (a few seconds) for a running release's outcome: a job's state is news."""

    @property
    def computed_in_request(self) -> bool:
        """Whether the request computes the release itself after its charge, under a lease (:mod:`.liveness`)."""

    def answer(self, release: schemas.Release, created: bool) -> Outcome: ...


@dataclass(frozen=True)
class Outcome:
    """What a release request answers: the release, its status (201 created, 200 the replay of an earlier request
    with its key, 202 a job still running) and, for a job, where to poll it."""

    release: schemas.Release
    status: int
    location: str | None = None


def release_view(release: db.Release, execution: schemas.ReleaseExecution | None = None) -> schemas.Release:
    """The release as the API shows it; ``execution`` only for a key that sees it
    (:func:`labels_party.http.access.sees_execution`)."""
    return schemas.Release(
        id=release.id, dataset_id=release.dataset_id, mechanism=release.mechanism, epsilon=release.epsilon,
        charged_epsilon=units_epsilon(release.charge_units), certified_epsilon=release.certified_epsilon,
        prior_epsilon=release.prior_epsilon, randomizer_epsilon=release.randomizer_epsilon,
        num_examples=release.num_examples, label_version=release.label_version,
        created_at=release.created_at, idempotency_key=release.idempotency_key,
        mechanism_hash=release.mechanism_hash, description=json.loads(release.description_json or "{}"),
        noisy_prior=json.loads(release.prior_json) if release.prior_json else None, state=release.state or "available",
        error=json.loads(release.error_json) if release.error_json else None, execution=execution)


def existing_release(session: Session, principal: Principal, dataset_id: str, key: str,
                     body_hash: str) -> db.Release | None:
    existing = session.scalar(select(db.Release).where(
        db.Release.dataset_id == dataset_id, db.Release.requester_org_id == principal.org_id,
        db.Release.idempotency_key == key))
    if existing is not None and existing.body_hash != body_hash:
        raise LabelDPError("this Idempotency-Key was already used with a different request body",
                           code=ErrorCode.IDEMPOTENCY_CONFLICT)
    return existing


def release_failed(release_id: str) -> LabelDPError:
    return LabelDPError(f"release {release_id} was charged before it was computed and could not be completed; it "
                        "stays charged and failed. Send a new request with a new Idempotency-Key to try again",
                        code=ErrorCode.RELEASE_FAILED)


def write_file(ctx: ServiceContext, release_id: str, draft: Draft, example_ids: Sequence[str] | None) -> str:
    with ctx.sessions() as session, session.begin():
        relative = session.get(db.Release, release_id).file
    if draft.write is not None:
        return ctx.store.write_with(relative, draft.write)
    return ctx.store.write_table(relative, pa.table({"example_id": pa.array(example_ids, pa.string()),
                                                     **draft.columns}))


def finish(ctx: ServiceContext, release_id: str, draft: Draft, *, sealed: tuple[int, str] | None = None,
           also: Callable[[Session, db.Release], None] | None = None) -> schemas.Release:
    """Store the public mechanism document; with ``sealed`` — the (size, SHA-256) of the file it makes available,
    computed before its row is locked — the release is available (without: a job's, still running, which ``also``
    queues in the same transaction). Refused if the request lost its lease: another replica fails the release."""
    with ctx.sessions() as session, session.begin():
        # the dataset's row first (every writer's lock order): an available release appends to its chain
        session.get(db.Dataset, session.scalar(select(db.Release.dataset_id).where(db.Release.id == release_id)),
                    with_for_update=True)
        release = session.get(db.Release, release_id, with_for_update=True)
        if release.state != "running":
            raise LabelDPError(f"release {release_id} is {release.state}", code=ErrorCode.RELEASE_FAILED)
        if not liveness.settle(ctx.jobs, session, release_id, "succeeded"):
            log.warning("release %s: its lease was lost; another process fails it", release_id)
            raise LabelDPError(f"release {release_id} was taken over by another process", code=ErrorCode.RELEASE_FAILED)
        document = {"description": draft.description, "noisy_prior": draft.noisy_prior}
        release.mechanism_hash = documents.store(session, document)
        release.certified_epsilon = draft.privacy.certified_epsilon
        release.description_json, release.prior_json = documents.shown(document)
        if sealed is not None:
            seal(ctx.ledger, session, release, sealed)
        if also is not None:
            also(session, release)
        session.flush()
        ctx.checkpoint("before_finish_commit")
        view = release_view(release)
    ctx.checkpoint("after_finish_commit")
    return view


def fail(ctx: ServiceContext, release_id: str, file: str | None) -> None:
    """A charged release that could not be completed: failed, charged, no file. Only a release still running
    fails (one that became available keeps its labels), and only while the request holds its lease: one taken over
    is the other replica's to fail, but the file this request may have written goes all the same. If the database
    is gone too, the lease expires and a replica fails it (or the startup sweep, alone)."""
    discard = False
    try:
        with ctx.sessions() as session, session.begin():
            release = session.get(db.Release, release_id, with_for_update=True)
            file = file or release.own_file()
            if release.state != "available":
                if liveness.settle(ctx.jobs, session, release_id, "failed") and release.state == "running":
                    release.state, release.error_json = "failed", INTERRUPTED.as_json()
                discard = True
    except Exception:  # noqa: BLE001 - the original failure is what the caller reports
        log.exception("could not record release %s as failed", release_id)
    if discard and file is not None:
        try:
            ctx.store.remove(file)
        except OSError:
            pass
