"""The release transaction, the same for every kind of release: nothing private is drawn before it is paid for.

:func:`run` checks the request's ε against the deployment's range, then

1. **begin** — the Idempotency-Key: a key already used by this organization on this dataset returns that request's
   outcome (waiting while it is still computed; a source dataset's failed job runs again), never a new draw; a key
   used with another body is a 409 — before anything is computed for this request (access was decided before the
   body was read: :mod:`labels_party.http.access`);
   Then the organization's **quota**: a release slot, waited for a bounded time, and a time bucket that is not
   empty (:mod:`labels_party.runtime.quotas`) — else 429 (or 503 at the service's capacity) with ``Retry-After``,
   nothing charged; its own load is public to it, so this refusal, too, comes before the charge;
2. **cover** — the kind names the examples it covers (a list of ids, looked up in one pass over the label
   version, or the whole version, whose coverage set was stored at upload; a source dataset: all its rows, and
   its counts taken at registration); unknown ids are refused. A kind may leave some of the ids it named out of
   the coverage, from its public inputs alone (``covers``: per-example priors that give k = 1); they are neither
   charged nor released;
3. **price** — the kind decides, from public inputs only, everything that can refuse the request (mechanism,
   domain, options, solver limits, ε split) and what it costs: its ``dp_event``;
4. **charge** — one transaction checks that the request's API key is still in force (its row read again and
   locked: a key revoked while the request waited is the same 401 as any invalid key, nothing charged), then,
   under the dataset lock, reserves the Idempotency-Key, has the ledger check the organization's
   account exactly and charge it (the record appended), and inserts the release ``running`` — computed in the
   request, with its ``compute_release`` job leased by this process (:mod:`.liveness`: a replica fails it if this
   process dies). Only after it commits is any private quantity (a noisy prior, a privatized label, a noisy loss,
   a trained parameter) drawn;
5. **complete** — the :class:`Completion`, the strategy of what follows the commit: in process
   (:data:`IN_PROCESS`: the kind computes a :class:`~.lifecycle.Draft` outside any transaction — it never
   refuses: a solve that cannot certify falls back deterministically, see :mod:`labels_party.core.registry` — the file
   is written and one transaction stores the public mechanism document and makes the release ``available``: 201),
   or by a Spark job (:data:`~.source.SPARK_JOB`: planned from the stored counts, the document stored, the job
   started: 202 and ``running`` until it wrote the labels). If anything fails after the charge — a crash, a full
   disk — the release is ``failed`` and stays charged; its outcome says nothing about the data (503
   ``release_failed``, whatever the cause: a full disk is not told apart as 507 here, since whether the disk fills
   while the privatized labels are written depends on their compressed size, a function of the data). Before the
   charge, running out of disk, memory or descriptors is 507 ``insufficient_storage`` / 503 ``resource_exhausted``
   with nothing charged (:func:`shared.errors.resource_error`).

A release belongs to the organization that requested it: its idempotency key, its visibility and its download are
that organization's (and the dataset owner's admins').
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from labels_party.core.solvers.deadline import Deadline
from labels_party.http.access import Admission, admitted_dataset, is_owner
from labels_party.http.auth import Principal
from labels_party.ledger import Actor, BudgetExceeded, RecordFields, budgets, canonical
from labels_party.releases import liveness
from labels_party.releases.lifecycle import (
    Completion,
    Computation,
    Covered,
    Outcome,
    Priced,
    ReleaseKind,
    Snapshot,
    existing_release,
    fail,
    finish,
    release_failed,
    release_view,
    write_file,
)
from labels_party.releases.source import SPARK_JOB
from labels_party.runtime.context import ServiceContext, check_epsilon_range
from labels_party.store import db, labelstore
from labels_party.store.usage import release_bytes, stored_bytes
from shared import schemas
from shared.domains import domain_from_spec
from shared.errors import ErrorCode, LabelDPError, RetryLater, status_of
from shared.service.keys import UNAUTHORIZED_MESSAGE
from shared.service.leases import Lease
from shared.service.storage_quota import KEPT_FOR_THE_AUDIT, check_room

log = logging.getLogger(__name__)
POLL_SECONDS = 0.1  # how often a request waits for the outcome of another one with its key
OUTCOME_WAIT_SECONDS = 2.0  # how long it waits at most (a worker thread each: many waiters must not starve others)


@dataclass(frozen=True)
class InProcess:
    """The labels are read, privatized and written within the request."""

    suffix: str = ".parquet"

    def cover(self, ctx: ServiceContext, snapshot: Snapshot, kind: ReleaseKind[Any]) -> Covered:
        example_ids, inputs = kind.inputs(snapshot)
        if example_ids is None:
            return Covered(snapshot.coverage, inputs=inputs)
        index, labels = labelstore.lookup(ctx.store, snapshot.file, example_ids)
        covers = kind.covers(inputs)
        if covers is not None:  # the rest were looked up only to refuse unknown ids: neither charged nor released
            example_ids = [example for example, covered in zip(example_ids, covers, strict=True) if covered]
            index, labels = index[covers], labels[covers]
        return Covered(labelstore.coverage_of(ctx.store, snapshot.dataset.id, index), example_ids, labels, inputs)

    def check(self, snapshot: Snapshot, priced: Priced) -> None:
        pass

    def complete(self, ctx: ServiceContext, release_id: str, snapshot: Snapshot, kind: ReleaseKind[Any],
                 covered: Covered, priced: Priced) -> schemas.Release:
        computation = Computation(ctx.random_source(), Deadline(ctx.settings.solver_seconds))
        if covered.labels is None:
            draft = kind.compute_version(snapshot, snapshot.read(ctx), priced, computation)
        else:
            draft = kind.compute(snapshot, covered.labels, covered.inputs, priced, computation)
        file = write_file(ctx, release_id, draft, covered.example_ids)
        ctx.checkpoint("release_written")  # tests take the release over here, its labels written, not yet visible
        return finish(ctx, release_id, draft, sealed=ctx.store.digest(file))

    def abandon(self, ctx: ServiceContext, release_id: str) -> None:
        pass  # fail removed the release's file

    def replayed(self, ctx: ServiceContext, session: Session, release: db.Release) -> bool:
        return False

    @property
    def waits(self) -> bool:
        return True

    @property
    def computed_in_request(self) -> bool:
        return True

    def restart(self, ctx: ServiceContext, release_id: str) -> None:
        raise AssertionError("an in-process release is never restarted")

    def answer(self, release: schemas.Release, created: bool) -> Outcome:
        return Outcome(release, 201 if created else 200)


IN_PROCESS = InProcess()


@dataclass(frozen=True)
class ChargedRelease:
    """What the charge left: the release the key stands for, whether this request charged it (else a concurrent
    request with its key did), and the lease this request computes it under (None: not computed in the request)."""

    release_id: str
    fresh: bool
    lease: Lease | None = None


def run(ctx: ServiceContext, admission: Admission, idempotency_key: str | None, kind: ReleaseKind[Any]) -> Outcome:
    """Every release, whatever its kind and completion: a retry with the same key and body answers the stored
    release (or its job's state), never a second draw or charge."""
    principal = admission.principal
    for name, epsilon in kind.epsilons().items():
        check_epsilon_range(ctx, epsilon, name)
    kind.check()
    key = checked_key(idempotency_key)
    body_hash = body_hash_of(kind)
    begun = _begin(ctx, admission, key, body_hash)
    if isinstance(begun, Outcome):
        return begun
    snapshot, completion = begun
    # The organization's quotas (its own load and storage: public to it) are the last refusals that cost nothing:
    # a slot is held, and the time it held the slot debited afterwards, from the lookup of the ids to the answer
    # (labels_party.runtime.quotas); in it, its stored releases and label versions are counted — at its storage
    # quota no new release is drawn or charged (checked in the slot, so its concurrent releases pass it at most
    # release_slots_per_org at a time: the twenty-eighth review's burst of five before the slot went 1.47 times over).
    with ctx.quotas.slot(principal.org_id):
        with ctx.sessions() as session:
            used = stored_bytes(session, ctx.store, principal.org_id)
        return _release(ctx, admission, snapshot, completion, kind, key, body_hash, used)


def _release(ctx: ServiceContext, admission: Admission, snapshot: Snapshot, completion: Completion,
             kind: ReleaseKind[Any], key: str, body_hash: str, used: int) -> Outcome:
    """Cover, price, charge and complete a new release (steps 2–5 of the module); ``used``: what its organization
    stores, against which what the release will store is refused before it is charged."""
    covered = completion.cover(ctx, snapshot, kind)
    try:  # a refusal from here to the charge's commit leaves no coverage file behind
        priced = kind.price(ctx, snapshot, covered.coverage.size, covered.inputs)
        completion.check(snapshot, priced)
        ids = getattr(getattr(kind, "request", None), "example_ids", None)
        check_room(used, release_bytes(ctx, snapshot, covered.coverage.size, priced, ids), ctx.storage_quota,
                   "a new release or evaluation (its files)", KEPT_FOR_THE_AUDIT)
        charged = charge(ctx, admission.principal, snapshot, kind, priced, covered.coverage, key, body_hash,
                         suffix=completion.suffix, leased=completion.computed_in_request)
    finally:
        labelstore.discard(ctx.store, covered.coverage)
    release_id = charged.release_id
    if not charged.fresh:  # a concurrent request with this key was charged first
        return completion.answer(outcome(ctx, release_id, completion.waits), False)
    with liveness.computing(ctx.jobs, charged.lease):
        try:
            return completion.answer(completion.complete(ctx, release_id, snapshot, kind, covered, priced), True)
        except BaseException as err:
            fail(ctx, release_id, None)
            completion.abandon(ctx, release_id)
            if not isinstance(err, Exception):  # a process going down: its lease expires, a replica fails it
                raise
            log.exception("release %s failed after it was charged", release_id)
            raise release_failed(release_id) from None


def checked_key(idempotency_key: str | None) -> str:
    if not idempotency_key or len(idempotency_key) > 200:
        raise LabelDPError("an Idempotency-Key header (1-200 characters) is required for releases",
                           code=ErrorCode.IDEMPOTENCY_KEY_REQUIRED)
    return idempotency_key


def body_hash_of(kind: ReleaseKind[Any]) -> str:
    return hashlib.sha256(canonical(kind.identity()).encode()).hexdigest()


def outcome(ctx: ServiceContext, release_id: str, waits: bool) -> schemas.Release:
    """The release a key stands for (this key's organization's: its key found it), once it is no longer being
    computed: its view, or the failure it ended in. Waits (``waits``; a job's state is news at once) a few seconds
    at most — a waiting request holds a worker thread — then 409 ``release_in_progress``: the client sends it again
    later (the features party's client does, polling)."""
    deadline = time.monotonic() + OUTCOME_WAIT_SECONDS
    while True:
        with ctx.sessions() as session, session.begin():
            release = session.get(db.Release, release_id)
            ctx.ledger.check_shown(session, session.get(db.Dataset, release.dataset_id), [release])  # as chained
            state, view = release.state, release_view(release)
        if state == "available" or not waits:
            return view
        if state == "failed":
            raise release_failed(release_id)
        if time.monotonic() > deadline:
            raise LabelDPError("a request with this Idempotency-Key is still being computed; send it again later",
                               code=ErrorCode.RELEASE_IN_PROGRESS)
        time.sleep(POLL_SECONDS)


def _begin(ctx: ServiceContext, admission: Admission, key: str,
           body_hash: str) -> Outcome | tuple[Snapshot, Completion]:
    """Idempotency and the snapshot: the outcome of the release this key already stands for, or the snapshot to
    release from and how the release is completed (a source dataset's by a Spark job)."""
    principal = admission.principal
    with ctx.sessions() as session, session.begin():
        dataset = _ready_dataset(session, admission)
        completion = _completion_of(dataset)
        existing = existing_release(session, principal, dataset.id, key, body_hash)
        if existing is None:
            return _snapshot(ctx, session, dataset, principal), completion
        restart = completion.replayed(ctx, session, existing)
        replayed = existing.id
    if restart:
        completion.restart(ctx, replayed)
    return completion.answer(outcome(ctx, replayed, completion.waits), False)


def _ready_dataset(session: Session, admission: Admission) -> db.Dataset:
    dataset = admitted_dataset(session, admission)
    if dataset.state != "ready":  # public to whoever sees the dataset: refused before anything is read
        raise LabelDPError(f"dataset {dataset.id} is {dataset.state}: it takes releases once its registration "
                           "is ready", code=ErrorCode.DATASET_NOT_READY)
    return dataset


def _completion_of(dataset: db.Dataset) -> Completion:
    return SPARK_JOB if dataset.source_uri is not None else IN_PROCESS


def _snapshot(ctx: ServiceContext, session: Session, dataset: db.Dataset, principal: Principal) -> Snapshot:
    """The dataset's labels as the chain says they are now, and the organization's δ allocation on it."""
    account = budgets.account_of(session, dataset, principal.org_id)
    delta = account.delta if account is not None else 0.0
    domain = domain_from_spec(json.loads(dataset.domain_json))
    if dataset.source_uri is not None:  # its labels stay in the source's copy: every row, version 0
        rows = dataset.num_examples if dataset.source_snapshot is None else \
            ctx.ledger.source_read(session, dataset).num_examples  # as registered (the chain says)
        return Snapshot(dataset, domain, 0, dataset.source_uri, rows, labelstore.range_coverage(0, rows), delta=delta,
                        id_bytes=int(dataset.source_id_bytes or 0))
    version = session.scalar(select(db.LabelVersion).where(
        db.LabelVersion.dataset_id == dataset.id, db.LabelVersion.version == dataset.label_version))
    if version is None:
        raise LabelDPError("the dataset has no labels yet", code=ErrorCode.NO_LABELS)
    file, coverage = ctx.ledger.labels_read(session, dataset, version)  # as the chain says, not the row
    return Snapshot(dataset, domain, version.version, file, coverage.size, coverage, delta, int(version.id_bytes))


def check(ctx: ServiceContext, admission: Admission, kinds: Sequence[ReleaseKind[Any]]) -> list[schemas.ReleaseCheck]:
    """Steps 2 and 3 of the module for each of ``kinds`` — what a client means to ask for together (an auto job's
    parts): each release's refusal, or how many examples it would cover, as its request would get it now. Nothing
    is drawn, charged or stored (the coverage files are discarded), and no Idempotency-Key is taken. Every refusal
    here is one a release decides on public inputs, so a client that asks for several releases can be refused
    before the first is charged. Budgets are not checked (a concurrent release may spend them meanwhile): parts of
    disjoint examples are charged independently."""
    principal = admission.principal
    for kind in kinds:  # the deployment's ε range is the request schema's (OpenAPI): outside it, the whole is a 400
        for name, epsilon in kind.epsilons().items():
            check_epsilon_range(ctx, epsilon, name)
    with ctx.sessions() as session, session.begin():
        dataset = _ready_dataset(session, admission)
        snapshot = _snapshot(ctx, session, dataset, principal)
    completion = _completion_of(dataset)
    out: list[schemas.ReleaseCheck] = []
    with ctx.quotas.slot(principal.org_id):  # the lookups cost what a release's do: the same quota
        for kind in kinds:
            try:
                kind.check()
                covered = completion.cover(ctx, snapshot, kind)
                try:
                    completion.check(snapshot, kind.price(ctx, snapshot, covered.coverage.size, covered.inputs))
                finally:
                    labelstore.discard(ctx.store, covered.coverage)
            except LabelDPError as err:
                if isinstance(err, RetryLater) or status_of(err.code) >= 500:  # the service's, not the release's
                    raise
                out.append(schemas.ReleaseCheck(error=schemas.ErrorDetail(code=err.code, message=str(err))))
                continue
            out.append(schemas.ReleaseCheck(num_examples=covered.coverage.size))
    return out


def charge(ctx: ServiceContext, principal: Principal, snapshot: Snapshot, kind: ReleaseKind[Any], priced: Priced,
           coverage: labelstore.CoverageSet, key: str, body_hash: str, *, suffix: str, leased: bool) -> ChargedRelease:
    """Reserve the key and charge the release in one transaction under the dataset lock: this request's release
    (``leased``: with its lease, :mod:`.liveness`), or the release a concurrent request with this key was charged
    for. Nothing private has been drawn yet; from the commit on, the release is paid whatever happens. Its labels
    will be ``releases/{id}`` + ``suffix``."""
    dataset_id, release_id = snapshot.dataset.id, db.new_id()
    superseded: tuple[str, ...] = ()
    try:
        with ctx.sessions() as session, session.begin():
            now = _key_in_force(session, principal)
            # The dataset's lock next (the ledger takes it too): a concurrent request on this key waits here and
            # then finds this one's release, instead of charging and losing the key's unique constraint.
            session.get(db.Dataset, dataset_id, with_for_update=True)
            existing = existing_release(session, principal, dataset_id, key, body_hash)
            if existing is not None:
                return ChargedRelease(existing.id, False)
            try:
                charged = ctx.ledger.charge(
                    session, dataset_id, principal.org_id, coverage, priced.dp_event(), kind.epsilon, RecordFields(
                        release_id=release_id, created_at=now.isoformat(),
                        actor=Actor(org=principal.org_name, role=principal.role, key_id=principal.key_id,
                                    key_prefix=principal.key_prefix), mechanism=kind.mechanism,
                        request=kind.record(), label_version=snapshot.version, prior_epsilon=priced.prior_epsilon))
            except BudgetExceeded as err:
                raise err.told_to(is_owner(principal, snapshot.dataset)) from None
            superseded = charged.superseded
            labelstore.keep(ctx.store, coverage)  # admitted: the record names it from the commit on
            release = db.Release(
                id=release_id, dataset_id=dataset_id, requester_org_id=principal.org_id, idempotency_key=key,
                body_hash=body_hash, mechanism=kind.mechanism, epsilon=kind.epsilon,
                charge_units=charged.standalone_units, certified_epsilon=None,
                prior_epsilon=priced.prior_epsilon, randomizer_epsilon=kind.epsilon - priced.prior_epsilon,
                num_examples=coverage.size, label_version=snapshot.version, description_json="{}",
                file=f"releases/{release_id}{suffix}", state="running")
            session.add(release)
            session.flush()
            lease = liveness.lease(ctx.jobs, session, release) if leased else None
            ctx.checkpoint("before_charge_commit")
    except IntegrityError:  # the key's unique constraint: a concurrent request got there first
        with ctx.sessions() as session, session.begin():
            existing = existing_release(session, principal, dataset_id, key, body_hash)
            if existing is None:
                raise
            return ChargedRelease(existing.id, False)
    try:  # charged: from here on a failure is the release's, paid for
        ctx.checkpoint("after_charge_commit")
    except BaseException as err:
        if lease is not None:  # renewed from its insertion until adopted (JobRunner.lease_new): never adopted now
            ctx.jobs.let_go(lease)
        if not isinstance(err, Exception):  # a process going down: its lease expires, a replica fails it
            raise
        fail(ctx, release_id, None)
        log.exception("release %s failed after it was charged", release_id)
        raise release_failed(release_id) from None
    _discard(ctx, superseded)
    return ChargedRelease(release_id, True, lease)


def _discard(ctx: ServiceContext, superseded: tuple[str, ...]) -> None:
    """Budget files older than the state a committed charge replaced; best effort."""
    for old in superseded:
        try:
            ctx.store.remove(old)
        except OSError:
            pass


def _key_in_force(session: Session, principal: Principal) -> datetime:
    """The request's API key is still in force now, at the charge (it was checked when the request was admitted,
    but a release may have waited since — for its organization's slot, for the dataset's lock): its row read
    again, and locked against a concurrent revocation (PostgreSQL: ``FOR SHARE`` — charges by one key do not wait
    for each other, a revocation's update waits for them and they for it). So either the revocation commits first
    and this charge is refused, or the charge commits first and its record precedes the revocation's fact on the
    chain. The key's row is locked before the dataset's, the order the revocation takes them in
    (:meth:`shared.service.keys.KeyRing.revoke`, then :func:`labels_party.ledger.chain.key`). A key no longer in
    force is the same 401 as any invalid key, before anything is charged or drawn. Returns the time it was checked
    at: the record's ``created_at``, so that a record after a rotation's revocation fact predates its end."""
    key = session.get(db.ApiKey, principal.key_id, with_for_update={"read": True})
    now = db.utcnow()
    if key is None or not key.in_force(now):
        raise LabelDPError(UNAUTHORIZED_MESSAGE, code=ErrorCode.UNAUTHORIZED)
    return now
