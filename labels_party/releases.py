"""Private releases: one-shot labels, per-example priors, group priors, private evaluation and central training.

Every flow has the same shape: :func:`_begin_release` (idempotency, label snapshot), a fail-fast budget check, the
label-dependent computation outside any transaction, giving a :class:`_Draft`, then :func:`_commit_release`, which
checks the budget exactly, charges it and makes the release visible in one transaction under the dataset lock —
a release is charged before it is visible and a crash leaves either both or neither. A release belongs to the
organization that requested it: its idempotency key, its visibility and its download are that organization's
(and the dataset owner's admins').
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from labels_party import db, documents, registry
from labels_party.auth import Principal
from labels_party.evaluation import evaluate
from labels_party.ledger import Actor, canonical, charge_units, units_epsilon
from labels_party.pipeline import privatize_by_group, privatize_labels
from labels_party.registry import MechanismOptions
from labels_party.service import ServiceContext, accessible_dataset, check_epsilon_range, registry_ids
from labels_party.solvers.classification import rr_with_prior_per_example
from labels_party.solvers.deadline import Deadline
from labels_party.uploads import parse_groups, parse_priors, upload_format
from shared import schemas
from shared.domains import Classes, domain_from_spec
from shared.errors import LabelDPError
from shared.mechanisms import events
from shared.randomness import secure_rng
from shared.service.gate import SpooledBody


def _hash(body: dict) -> str:
    return hashlib.sha256(canonical(body).encode()).hexdigest()


def _not_found() -> LabelDPError:
    return LabelDPError("no such release for this key", code="not_found")


def _existing_release(session: Session, principal: Principal, dataset_id: str, key: str,
                      body_hash: str) -> db.Release | None:
    existing = session.scalar(select(db.Release).where(
        db.Release.dataset_id == dataset_id, db.Release.requester_org_id == principal.org_id,
        db.Release.idempotency_key == key))
    if existing is not None and existing.body_hash != body_hash:
        raise LabelDPError("this Idempotency-Key was already used with a different request body",
                           code="idempotency_conflict")
    return existing


def release_view(release: db.Release) -> schemas.Release:
    return schemas.Release(
        id=release.id, dataset_id=release.dataset_id, mechanism=release.mechanism, epsilon=release.epsilon,
        charged_epsilon=units_epsilon(release.charge_units), certified_epsilon=release.certified_epsilon,
        prior_epsilon=release.prior_epsilon, randomizer_epsilon=release.randomizer_epsilon,
        num_examples=release.num_examples, label_version=release.label_version,
        created_at=release.created_at, idempotency_key=release.idempotency_key,
        mechanism_hash=release.mechanism_hash, description=json.loads(release.description_json),
        noisy_prior=json.loads(release.prior_json) if release.prior_json else None)


def _covered_rows(ctx: ServiceContext, dataset: db.Dataset, version_index: np.ndarray,
                  example_ids: list[str] | None) -> np.ndarray:
    """Rows of the label version to release (all, or the requested ids; unknown ids are an error)."""
    if example_ids is None:
        return np.arange(version_index.size)
    if len(set(example_ids)) != len(example_ids):
        raise LabelDPError("example_ids contains duplicates", code="duplicate_example_id")
    registry = registry_ids(ctx, dataset)
    index = pc.index_in(pa.array(example_ids, type=pa.string()), value_set=registry)
    wanted = index.to_numpy(zero_copy_only=False)
    rows = np.full(len(example_ids), -1, dtype=np.int64)
    known = ~np.isnan(wanted) if wanted.dtype.kind == "f" else np.ones(len(example_ids), dtype=bool)
    positions = np.searchsorted(version_index, np.nan_to_num(wanted[known]).astype(np.int64))
    positions = np.minimum(positions, version_index.size - 1)
    hit = version_index[positions] == np.nan_to_num(wanted[known]).astype(np.int64)
    rows[np.flatnonzero(known)[hit]] = positions[hit]
    if np.any(rows < 0):
        missing = [example_ids[i] for i in np.flatnonzero(rows < 0)[:3]]
        raise LabelDPError(f"{int((rows < 0).sum())} example id(s) have no current label, e.g. {missing}",
                           code="unknown_example_ids")
    return rows


@dataclass(frozen=True)
class _Snapshot:
    dataset: db.Dataset
    domain: object
    version: int
    version_index: np.ndarray  # registry index of each labelled example of the current version
    labels: np.ndarray


def _begin_release(ctx: ServiceContext, principal: Principal, dataset_id: str, idempotency_key: str | None,
                   body_hash: str) -> tuple[schemas.Release | None, _Snapshot | None]:
    """Access, idempotency and the label snapshot: (stored release to return, None) or (None, snapshot)."""
    if not idempotency_key or len(idempotency_key) > 200:
        raise LabelDPError("an Idempotency-Key header (1-200 characters) is required for releases",
                           code="idempotency_key_required")
    with ctx.sessions() as session, session.begin():
        dataset = accessible_dataset(session, principal, dataset_id)
        existing = _existing_release(session, principal, dataset_id, idempotency_key, body_hash)
        if existing is not None:
            return release_view(existing), None
        version = session.scalar(select(db.LabelVersion).where(
            db.LabelVersion.dataset_id == dataset_id, db.LabelVersion.version == dataset.label_version))
        if version is None:
            raise LabelDPError("the dataset has no labels yet", code="no_labels")
    table = ctx.store.read_table(version.file)
    return None, _Snapshot(dataset, domain_from_spec(json.loads(dataset.domain_json)), version.version,
                           table.column("registry_index").to_numpy(), table.column("label").to_numpy())


def _cover(ctx: ServiceContext, snapshot: _Snapshot, example_ids, epsilon: float):
    """(rows of the label snapshot, their registry indices) for the requested examples — all of them when
    ``example_ids`` is None — after a fail-fast budget check (the exact one runs again under the lock)."""
    rows = _covered_rows(ctx, snapshot.dataset, snapshot.version_index, example_ids)
    covered = snapshot.version_index[rows]
    with ctx.sessions() as session, session.begin():
        remaining = ctx.ledger.remaining_units_for(session.get(db.Dataset, snapshot.dataset.id), covered)
    if charge_units(epsilon) > remaining:
        raise _budget_error(epsilon, units_epsilon(remaining))
    return rows, covered


@dataclass(frozen=True)
class _Draft:
    """A computed, not yet visible release: what it publishes and what it costs."""

    mechanism: str
    request: dict[str, Any]  # the privacy parameters, as recorded (no ids, features or predictions)
    epsilon: float  # requested; charged rounded up to 10⁻⁹
    privacy: Any  # the mechanism result: certified_epsilon and dp_event()
    covered: np.ndarray
    columns: dict  # privatized labels (without example ids)
    description: dict  # public; stored once in a mechanism document
    noisy_prior: dict | None = None
    prior_epsilon: float = 0.0
    delta: float = 0.0


def _commit_release(ctx: ServiceContext, principal: Principal, dataset_id: str, idempotency_key: str,
                    body_hash: str, snapshot: _Snapshot, draft: _Draft) -> tuple[schemas.Release, bool]:
    """Write the file, then check-charge-insert in one transaction under the dataset lock."""
    release_id = db.new_id()
    example_ids = registry_ids(ctx, snapshot.dataset).take(pa.array(draft.covered))
    file = ctx.store.write_table(f"releases/{release_id}.parquet",
                                 pa.table({"example_id": example_ids, **draft.columns}))  # columns may be empty
    document = {"description": draft.description, "noisy_prior": draft.noisy_prior}
    units = charge_units(draft.epsilon)
    try:
        with ctx.sessions() as session, session.begin():
            dataset = accessible_dataset(session, principal, dataset_id, lock=True)
            existing = _existing_release(session, principal, dataset_id, idempotency_key, body_hash)
            if existing is not None:  # a concurrent retry won the race
                ctx.store.remove(file)
                return release_view(existing), False
            mechanism_hash = documents.store(session, document)
            record, record_json, prev_hash, digest = ctx.ledger.charge(dataset, draft.covered, units, {
                "release_id": release_id, "created_at": db.utcnow().isoformat(),
                "actor": Actor(org=principal.org_name, role=principal.role), "mechanism": draft.mechanism,
                "request": draft.request, "label_version": snapshot.version, "epsilon_requested": draft.epsilon,
                "epsilon_certified": draft.privacy.certified_epsilon, "delta": draft.delta,
                "dp_event": events.to_dict(draft.privacy.dp_event()), "mechanism_hash": mechanism_hash})
            release = db.Release(
                id=release_id, dataset_id=dataset_id, requester_org_id=principal.org_id,
                idempotency_key=idempotency_key, body_hash=body_hash, mechanism=draft.mechanism,
                epsilon=draft.epsilon, charge_units=units, certified_epsilon=record.epsilon_certified,
                prior_epsilon=draft.prior_epsilon, randomizer_epsilon=draft.epsilon - draft.prior_epsilon,
                num_examples=int(draft.covered.size), label_version=snapshot.version,
                description_json=json.dumps(documents.summary(draft.description)), mechanism_hash=mechanism_hash,
                prior_json=json.dumps(documents.summary(draft.noisy_prior)) if draft.noisy_prior else None,
                file=file)
            session.add(release)
            session.add(db.LedgerEntry(dataset_id=dataset_id, seq=record.seq, release_id=release_id,
                                       record=record_json, prev_hash=prev_hash, hash=digest))
            session.flush()
            ctx.checkpoint("before_commit")
        ctx.checkpoint("after_commit")
    except IntegrityError:
        ctx.store.remove(file)
        with ctx.sessions() as session, session.begin():
            existing = _existing_release(session, principal, dataset_id, idempotency_key, body_hash)
            if existing is None:
                raise
            return release_view(existing), False
    except LabelDPError as err:
        ctx.store.remove(file)
        if err.code == "budget_exceeded":
            raise _budget_error(draft.epsilon, err.remaining) from None
        raise
    except BaseException:  # nothing references the file unless the transaction committed
        ctx.store.remove(file)
        raise
    return release_view(release), True


# -- the flows --------------------------------------------------------------------------------------------------

def release_labels(ctx: ServiceContext, principal: Principal, dataset_id: str, request: schemas.ReleaseRequest,
                   idempotency_key: str | None) -> tuple[schemas.Release, bool]:
    """Returns (release, created). A retry with the same key and body returns the stored release unchanged."""
    check_epsilon_range(ctx, request.epsilon)
    if request.prior_epsilon is not None:
        check_epsilon_range(ctx, request.prior_epsilon, "prior_epsilon")
    body_hash = _hash(request.model_dump())
    stored, snapshot = _begin_release(ctx, principal, dataset_id, idempotency_key, body_hash)
    if stored is not None:
        return stored, False
    # Expensive, label-dependent work: outside any transaction. Nothing here is visible until the charge commits.
    rows, covered = _cover(ctx, snapshot, request.example_ids, request.epsilon)
    options = MechanismOptions(mesh=request.mesh, clip=request.clip, exact=request.exact,
                               deadline=Deadline(ctx.settings.solver_seconds))
    result = privatize_labels(snapshot.domain, snapshot.labels[rows], request.mechanism, request.epsilon,
                              secure_rng(), prior_epsilon=request.prior_epsilon, options=options)
    noisy = result.noisy_labels
    columns = ({f"in_class_{k}": noisy[:, k] for k in range(noisy.shape[1])} if noisy.ndim == 2  # label sets
               else {"label": noisy})
    description = {**result.mechanism.describe(), "budget_split_rule": result.split.rule,
                   "randomizer_epsilon": result.split.randomizer_epsilon}
    return _commit_release(ctx, principal, dataset_id, idempotency_key, body_hash, snapshot, _Draft(
        request.mechanism, request.model_dump(exclude={"example_ids"}), request.epsilon, result, covered, columns,
        description, result.prior.describe() if result.prior else None, result.split.prior_epsilon))


def release_with_example_priors(ctx: ServiceContext, principal: Principal, dataset_id: str, epsilon: float,
                                body: SpooledBody, idempotency_key: str | None) -> tuple[schemas.Release, bool]:
    """RRWithPrior with one prior per example (multi-stage training, group priors). The priors arrive as a
    columnar body (example_id, p_0..p_{K-1}); they must be computed from features only — they are inputs the
    features party chooses, like the subset of examples, and are not privacy-relevant as long as they are."""
    check_epsilon_range(ctx, epsilon)
    request = {"mechanism": "rr-with-prior", "epsilon": epsilon, "per_example_priors": True,
               "priors_sha256": body.sha256}
    stored, snapshot = _begin_release(ctx, principal, dataset_id, idempotency_key, _hash(request))
    if stored is not None:
        return stored, False
    if not isinstance(snapshot.domain, Classes):
        raise LabelDPError("per-example priors need a classes dataset", code="mechanism_domain_mismatch")
    ids, priors = parse_priors(body.path, upload_format(body.media_type), snapshot.domain.num_classes)
    rows, covered = _cover(ctx, snapshot, ids, epsilon)
    result = rr_with_prior_per_example(priors, snapshot.labels[rows].astype(np.int64), epsilon, secure_rng())
    description = {"mechanism": "rr-with-prior", "per_example_priors": True, "epsilon": epsilon,
                   "certified_epsilon": result.certified_epsilon, "mean_k": float(result.k.mean()),
                   "k_histogram": np.bincount(result.k, minlength=snapshot.domain.num_classes + 1)[1:].tolist(),
                   "priors_sha256": body.sha256,
                   "budget_split_rule": "priors come from features: no budget spent on them"}
    return _commit_release(ctx, principal, dataset_id, idempotency_key, _hash(request), snapshot, _Draft(
        "rr-with-prior", request, epsilon, result, covered, {"label": result.outputs.astype(np.float64)},
        description))


def release_by_group(ctx: ServiceContext, principal: Principal, dataset_id: str, mechanism: str, epsilon: float,
                     prior_epsilon: float, body: SpooledBody,
                     idempotency_key: str | None) -> tuple[schemas.Release, bool]:
    """Group priors: the body assigns each example to a group computed from features (example_id, group); each
    group gets its own discrete-Laplace prior (ε_p, parallel across the disjoint groups) and its own randomizer
    at ε − ε_p: RRWithPrior for classes, the optimal unbiased randomizer (or RR-on-Bins) for regression."""
    check_epsilon_range(ctx, epsilon)
    check_epsilon_range(ctx, prior_epsilon, "prior_epsilon")
    if not registry.family(mechanism).needs_prior:  # a group release is one private prior per group
        with_prior = ", ".join(f.name for f in registry.FAMILIES.values() if f.needs_prior)
        raise LabelDPError(f"group releases use a mechanism with a prior: {with_prior}", code="unknown_mechanism")
    request = {"mechanism": mechanism, "epsilon": epsilon, "prior_epsilon": prior_epsilon, "group_priors": True,
               "groups_sha256": body.sha256}
    stored, snapshot = _begin_release(ctx, principal, dataset_id, idempotency_key, _hash(request))
    if stored is not None:
        return stored, False
    ids, groups = parse_groups(body.path, upload_format(body.media_type))
    rows, covered = _cover(ctx, snapshot, ids, epsilon)
    result = privatize_by_group(snapshot.domain, snapshot.labels[rows], groups, mechanism, epsilon,
                                secure_rng(), prior_epsilon=prior_epsilon,
                                options=MechanismOptions(deadline=Deadline(ctx.settings.solver_seconds)))
    per_group = [{"group": str(key), "examples": int(np.sum(groups == key)),
                  "noisy_prior": part.prior.describe(), "certified_epsilon": part.certified_epsilon,
                  "mechanism": part.mechanism.describe()}
                 for key, part in zip(result.groups, result.parts, strict=True)]
    description = {"mechanism": mechanism, "group_priors": True, "epsilon": epsilon, "prior_epsilon": prior_epsilon,
                   "certified_epsilon": result.certified_epsilon, "num_groups": len(result.groups),
                   "groups": per_group, "groups_sha256": body.sha256,
                   "budget_split_rule": "override; the groups compose in parallel"}
    return _commit_release(ctx, principal, dataset_id, idempotency_key, _hash(request), snapshot, _Draft(
        mechanism, request, epsilon, result, covered, {"label": result.noisy_labels}, description,
        prior_epsilon=prior_epsilon))


def central_training(ctx: ServiceContext, principal: Principal, dataset_id: str,
                     request: schemas.CentralTrainingRequest,
                     idempotency_key: str | None) -> tuple[schemas.Release, bool]:
    """Train with LabelDP-Pro here and return only the parameters; (ε, δ) is charged to the training examples
    (their ε adds to the per-example budget; δ is recorded in the ledger)."""
    # Imported here so that the labels service only loads JAX when central training is actually used.
    from labels_party.labeldp_pro import ProConfig, train_labeldp_pro

    check_epsilon_range(ctx, request.epsilon)
    if len(request.example_ids) != len(request.features) or len({len(f) for f in request.features}) != 1:
        raise LabelDPError("features must hold one vector per example id, all of the same length",
                           code="invalid_input")
    body_hash = _hash(request.model_dump())
    stored, snapshot = _begin_release(ctx, principal, dataset_id, idempotency_key, body_hash)
    if stored is not None:
        return stored, False
    if not snapshot.dataset.allow_central_training:
        raise LabelDPError("central training is not enabled for this dataset by its owner",
                           code="central_training_disabled")
    if not isinstance(snapshot.domain, Classes):
        raise LabelDPError("central training (LabelDP-Pro) needs a classes dataset", code="mechanism_domain_mismatch")
    rows, covered = _cover(ctx, snapshot, request.example_ids, request.epsilon)
    features = np.asarray(request.features, dtype=np.float32)
    config = ProConfig(denoiser=request.denoiser, epsilon=request.epsilon, delta=request.delta,
                       steps=request.steps, batch_size=min(request.batch_size, len(rows)),
                       learning_rate=request.learning_rate, hidden=tuple(request.hidden))
    result = train_labeldp_pro(config, features, snapshot.labels[rows].astype(np.int64),
                               snapshot.domain.num_classes, secure_rng())
    description = {"mechanism": "labeldp-pro", "denoiser": request.denoiser, "epsilon": request.epsilon,
                   "delta": request.delta, "certified_epsilon": result.epsilon, "noise_multiplier": result.sigma,
                   "steps": request.steps, "sampling_probability": result.sampling_probability,
                   "parameters": jax_tree_to_lists(result.params), "hidden": request.hidden,
                   "num_classes": snapshot.domain.num_classes}
    return _commit_release(ctx, principal, dataset_id, idempotency_key, body_hash, snapshot, _Draft(
        "labeldp-pro", request.model_dump(exclude={"example_ids", "features"}), request.epsilon, result, covered,
        {}, description, delta=request.delta))


def jax_tree_to_lists(tree) -> dict:
    return {"embeddings": [np.asarray(e).tolist() for e in tree["embeddings"]],
            "layers": [{"w": np.asarray(layer["w"]).tolist(), "b": np.asarray(layer["b"]).tolist()}
                       for layer in tree["layers"]]}


def evaluate_predictions(ctx: ServiceContext, principal: Principal, dataset_id: str,
                         request: schemas.EvaluationRequest,
                         idempotency_key: str | None) -> tuple[schemas.Release, bool]:
    """Private evaluation (see :mod:`labels_party.evaluation`), accounted like a release of the scored examples."""
    check_epsilon_range(ctx, request.epsilon)
    if len(request.example_ids) != len(request.predictions):
        raise LabelDPError("predictions must hold one number per example id", code="invalid_input")
    body_hash = _hash(request.model_dump())
    stored, snapshot = _begin_release(ctx, principal, dataset_id, idempotency_key, body_hash)
    if stored is not None:
        return stored, False
    rows, covered = _cover(ctx, snapshot, request.example_ids, request.epsilon)
    result = evaluate(request.metric, request.predictions, snapshot.labels[rows], request.epsilon, request.clip,
                      secure_rng())
    low, high = result.confidence_interval()
    description = {"mechanism": "evaluation", "metric": result.metric, "value": result.value,
                   "noise_scale": result.noise_scale, "clip": result.clip, "num_examples": result.num_examples,
                   "ci95_low": low, "ci95_high": high, "epsilon": request.epsilon,
                   "certified_epsilon": result.certified_epsilon, "noisy_sum": result.noisy_sum, "unit": result.unit,
                   "loss_levels": result.levels, "noise": result.noise.describe()}
    return _commit_release(ctx, principal, dataset_id, idempotency_key, body_hash, snapshot, _Draft(
        "evaluation", request.model_dump(exclude={"example_ids", "predictions"}), request.epsilon, result, covered,
        {}, description))


def _budget_error(epsilon: float, remaining: float) -> LabelDPError:
    error = LabelDPError(f"budget exceeded: this release needs epsilon {epsilon:g}, the covered examples have "
                         f"{remaining:.9g} left", code="budget_exceeded")
    error.remaining = remaining
    return error


# -- reading releases ------------------------------------------------------------------------------------------

def _visible(session: Session, principal: Principal, release: db.Release | None) -> bool:
    """A consumer sees its own organization's releases of datasets it is still granted; the owner's admins see
    every release of their datasets. Everyone else gets the same answer as for a release that does not exist."""
    if release is None:
        return False
    try:
        accessible_dataset(session, principal, release.dataset_id)
    except LabelDPError:
        return False
    return principal.role == "admin" or release.requester_org_id == principal.org_id


def get_release(ctx: ServiceContext, principal: Principal, release_id: str) -> tuple[schemas.Release, str]:
    with ctx.sessions() as session, session.begin():
        release = session.get(db.Release, release_id)
        if not _visible(session, principal, release):
            raise _not_found()
        return release_view(release), release.file


def list_releases(ctx: ServiceContext, principal: Principal, dataset_id: str) -> list[schemas.Release]:
    with ctx.sessions() as session, session.begin():
        accessible_dataset(session, principal, dataset_id)
        query = select(db.Release).where(db.Release.dataset_id == dataset_id).order_by(db.Release.created_at)
        if principal.role != "admin":
            query = query.where(db.Release.requester_org_id == principal.org_id)
        return [release_view(r) for r in session.scalars(query)]


def get_mechanism_document(ctx: ServiceContext, principal: Principal, mechanism_hash: str) -> dict:
    """A mechanism document, to anyone who can see a release that references it (404 otherwise)."""
    with ctx.sessions() as session, session.begin():
        query = select(db.Release).where(db.Release.mechanism_hash == mechanism_hash)
        if principal.role != "admin":
            query = query.where(db.Release.requester_org_id == principal.org_id)
        if not any(_visible(session, principal, release) for release in session.scalars(query)):
            raise LabelDPError("no such mechanism document for this key", code="not_found")
        return json.loads(session.get(db.MechanismDocument, mechanism_hash).document)
