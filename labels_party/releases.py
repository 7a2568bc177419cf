"""Private releases: one-shot labels, per-example priors, group priors, private evaluation and central
training. Each computes its draft outside any transaction, then `_commit_release` checks the budget, charges it and
makes the release visible in one transaction under the dataset lock, so a release is charged before it is visible
and a crash leaves either both or neither."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from dp_accounting import dp_event
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from labels_party import db
from labels_party.auth import Principal
from labels_party.evaluation import evaluate
from labels_party.ledger import (
    LocalRandomizerDpEvent,
    canonical,
    event_to_dict,
    mechanism_dp_event,
    prior_dp_event,
)
from labels_party.mechanisms import MechanismOptions
from labels_party.pipeline import privatize_by_group, privatize_labels
from labels_party.service import ServiceContext, accessible_dataset, registry_ids
from labels_party.solvers.classification import rr_with_prior_per_example
from labels_party.uploads import parse_groups, parse_priors
from shared import schemas
from shared.domains import Classes, domain_from_spec
from shared.errors import LabelDPError
from shared.privacy import check_epsilon
from shared.randomness import secure_rng


def _crash_point(name: str) -> None:
    """Test hook: LABELDP_CRASH_AT=<name> kills the process here (crash-safety tests only)."""
    if os.environ.get("LABELDP_CRASH_AT") == name:
        os._exit(70)


def _body_hash(request: schemas.ReleaseRequest) -> str:
    return hashlib.sha256(canonical(request.model_dump()).encode()).hexdigest()


def _existing_release(session: Session, dataset_id: str, key: str, body_hash: str) -> db.Release | None:
    existing = session.scalar(select(db.Release).where(db.Release.dataset_id == dataset_id,
                                                       db.Release.idempotency_key == key))
    if existing is not None and existing.body_hash != body_hash:
        raise LabelDPError("this Idempotency-Key was already used with a different request body",
                           code="idempotency_conflict")
    return existing


def release_view(release: db.Release) -> schemas.Release:
    return schemas.Release(
        id=release.id, dataset_id=release.dataset_id, mechanism=release.mechanism, epsilon=release.epsilon,
        certified_epsilon=release.certified_epsilon, prior_epsilon=release.prior_epsilon,
        randomizer_epsilon=release.randomizer_epsilon, num_examples=release.num_examples,
        label_version=release.label_version, created_at=db.as_utc(release.created_at),
        idempotency_key=release.idempotency_key, description=json.loads(release.description_json),
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
        existing = _existing_release(session, dataset_id, idempotency_key, body_hash)
        if existing is not None:
            return release_view(existing), None
        version = session.scalar(select(db.LabelVersion).where(
            db.LabelVersion.dataset_id == dataset_id, db.LabelVersion.version == dataset.label_version))
        if version is None:
            raise LabelDPError("the dataset has no labels yet", code="no_labels")
    table = ctx.store.read_table(version.file)
    return None, _Snapshot(dataset, domain_from_spec(json.loads(dataset.domain_json)), version.version,
                           table.column("registry_index").to_numpy(), table.column("label").to_numpy())


def _cover(ctx: ServiceContext, dataset_id: str, snapshot: _Snapshot, example_ids, epsilon: float):
    """(rows of the label snapshot, their registry indices) for the requested examples — all of them when
    ``example_ids`` is None — after a fail-fast budget check for ``epsilon``."""
    rows = _covered_rows(ctx, snapshot.dataset, snapshot.version_index, example_ids)
    covered = snapshot.version_index[rows]
    _check_budget(ctx, dataset_id, covered, epsilon)
    return rows, covered


def _check_budget(ctx: ServiceContext, dataset_id: str, covered: np.ndarray, epsilon: float) -> None:
    """Fail fast before the expensive work; the authoritative check runs again under the lock."""
    with ctx.sessions() as session, session.begin():
        remaining = ctx.ledger.remaining_for(session.get(db.Dataset, dataset_id), covered)
    if epsilon > remaining + 1e-9:
        raise _budget_error(epsilon, remaining)


@dataclass(frozen=True)
class _Draft:
    """A computed, not yet visible release."""

    mechanism: str
    epsilon: float
    certified_epsilon: float
    prior_epsilon: float
    randomizer_epsilon: float
    covered: np.ndarray
    columns: dict  # privatized labels (without example ids)
    description: dict
    prior: dict | None
    record: dict  # the privacy-event fields of the ledger record


def _commit_release(ctx: ServiceContext, principal: Principal, dataset_id: str, idempotency_key: str,
                    body_hash: str, snapshot: _Snapshot, draft: _Draft) -> tuple[schemas.Release, bool]:
    """Write the file, then check-charge-insert in one transaction under the dataset lock."""
    release_id = db.new_id()
    example_ids = registry_ids(ctx, snapshot.dataset).take(pa.array(draft.covered))
    file = ctx.store.write_table(f"releases/{release_id}.parquet",
                                 pa.table({"example_id": example_ids, **draft.columns}))  # columns may be empty
    record = {"event": "label_release", "release_id": release_id,
              "actor": {"org": principal.org_name, "role": principal.role}, "mechanism": draft.mechanism,
              "epsilon_requested": draft.epsilon, "epsilon_certified": draft.certified_epsilon,
              "label_version": snapshot.version, **draft.record}
    try:
        with ctx.sessions() as session, session.begin():
            dataset = accessible_dataset(session, principal, dataset_id, lock=True)
            existing = _existing_release(session, dataset_id, idempotency_key, body_hash)
            if existing is not None:  # a concurrent retry won the race
                ctx.store.remove(file)
                return release_view(existing), False
            record["created_at"] = db.utcnow().isoformat()
            record_json, prev_hash, digest = ctx.ledger.charge(dataset, draft.covered, draft.epsilon, record)
            release = db.Release(
                id=release_id, dataset_id=dataset_id, requester_org_id=principal.org_id,
                idempotency_key=idempotency_key, body_hash=body_hash, mechanism=draft.mechanism,
                epsilon=draft.epsilon, certified_epsilon=draft.certified_epsilon,
                prior_epsilon=draft.prior_epsilon, randomizer_epsilon=draft.randomizer_epsilon,
                num_examples=int(draft.covered.size), label_version=snapshot.version,
                description_json=json.dumps(draft.description),
                prior_json=json.dumps(draft.prior) if draft.prior else None, file=file)
            session.add(release)
            session.add(db.LedgerEntry(dataset_id=dataset_id, seq=dataset.ledger_seq, release_id=release_id,
                                       record=record_json, prev_hash=prev_hash, hash=digest))
            session.flush()
            _crash_point("before_commit")
        _crash_point("after_commit")
    except IntegrityError:
        ctx.store.remove(file)
        with ctx.sessions() as session, session.begin():
            existing = _existing_release(session, dataset_id, idempotency_key, body_hash)
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


def release_labels(ctx: ServiceContext, principal: Principal, dataset_id: str, request: schemas.ReleaseRequest,
                   idempotency_key: str | None) -> tuple[schemas.Release, bool]:
    """Returns (release, created). A retry with the same key and body returns the stored release unchanged."""
    body_hash = _body_hash(request)
    stored, snapshot = _begin_release(ctx, principal, dataset_id, idempotency_key, body_hash)
    if stored is not None:
        return stored, False
    # Expensive, label-dependent work: outside any transaction. Nothing here is visible until the charge commits.
    rows, covered = _cover(ctx, dataset_id, snapshot, request.example_ids, request.epsilon)
    options = MechanismOptions(mesh=request.mesh, clip=request.clip, exact=request.exact)
    result = privatize_labels(snapshot.domain, snapshot.labels[rows], request.mechanism, request.epsilon,
                              secure_rng(), prior_epsilon=request.prior_epsilon, options=options)
    noisy = result.noisy_labels
    columns = ({f"in_class_{k}": noisy[:, k] for k in range(noisy.shape[1])} if noisy.ndim == 2  # label sets
               else {"label": noisy})
    description = result.mechanism.describe()
    events = [mechanism_dp_event(result.mechanism)]
    if result.prior is not None:
        events.insert(0, prior_dp_event(result.prior))
    record = {
        "request": request.model_dump(exclude={"example_ids"}),
        "prior": result.prior.describe() if result.prior else None,
        "randomizer": {"epsilon": result.split.randomizer_epsilon,
                       "certified_epsilon": result.mechanism.certified_epsilon,
                       "parameters": description.get("parameters", {})},
        "budget_split_rule": result.split.rule,
        "dp_event": event_to_dict(dp_event.ComposedDpEvent(events)),
    }
    draft = _Draft(request.mechanism, request.epsilon, result.certified_epsilon, result.split.prior_epsilon,
                   result.split.randomizer_epsilon, covered, columns, description,
                   result.prior.describe() if result.prior else None, record)
    return _commit_release(ctx, principal, dataset_id, idempotency_key, body_hash, snapshot, draft)


def release_with_example_priors(ctx: ServiceContext, principal: Principal, dataset_id: str, epsilon: float,
                                path: Path, fmt: str, idempotency_key: str | None) -> tuple[schemas.Release, bool]:
    """RRWithPrior with one prior per example (multi-stage training, group priors). The priors arrive as a
    columnar body (example_id, p_0..p_{K-1}); they must be computed from features only — they are inputs the
    features party chooses, like the subset of examples, and are not privacy-relevant as long as they are."""
    epsilon = check_epsilon(epsilon)
    body = hashlib.sha256(path.read_bytes()).hexdigest()
    body_hash = hashlib.sha256(canonical({"epsilon": epsilon, "priors_sha256": body,
                                          "mechanism": "rr-with-prior"}).encode()).hexdigest()
    stored, snapshot = _begin_release(ctx, principal, dataset_id, idempotency_key, body_hash)
    if stored is not None:
        return stored, False
    if not isinstance(snapshot.domain, Classes):
        raise LabelDPError("per-example priors need a classes dataset", code="mechanism_domain_mismatch")
    ids, priors = parse_priors(path, fmt, snapshot.domain.num_classes)
    rows, covered = _cover(ctx, dataset_id, snapshot, ids, epsilon)
    result = rr_with_prior_per_example(priors, snapshot.labels[rows].astype(np.int64), epsilon, secure_rng())
    k_histogram = np.bincount(result.k, minlength=snapshot.domain.num_classes + 1)[1:].tolist()
    description = {"mechanism": "rr-with-prior", "per_example_priors": True, "epsilon": epsilon,
                   "certified_epsilon": result.certified_epsilon, "k_histogram": k_histogram,
                   "mean_k": float(result.k.mean()), "priors_sha256": body}
    record = {"request": {"mechanism": "rr-with-prior", "epsilon": epsilon, "per_example_priors": True},
              "prior": None, "priors_sha256": body,
              "randomizer": {"epsilon": epsilon, "certified_epsilon": result.certified_epsilon,
                             "parameters": {"k_histogram": k_histogram}},
              "budget_split_rule": "priors come from features: no budget spent on them",
              "dp_event": event_to_dict(dp_event.ComposedDpEvent([LocalRandomizerDpEvent(
                  mechanism="rr-with-prior", epsilon=result.certified_epsilon)]))}
    draft = _Draft("rr-with-prior", epsilon, result.certified_epsilon, 0.0, epsilon, covered,
                   {"label": result.outputs.astype(np.float64)}, description, None, record)
    return _commit_release(ctx, principal, dataset_id, idempotency_key, body_hash, snapshot, draft)


def release_by_group(ctx: ServiceContext, principal: Principal, dataset_id: str, mechanism: str, epsilon: float,
                     prior_epsilon: float, path: Path, fmt: str,
                     idempotency_key: str | None) -> tuple[schemas.Release, bool]:
    """Group priors: the body assigns each example to a group computed from features (example_id, group); each
    group gets its own discrete-Laplace prior (ε_p, parallel across the disjoint groups) and its own randomizer
    at ε − ε_p: RRWithPrior for classes, the optimal unbiased randomizer (or RR-on-Bins) for regression."""
    epsilon = check_epsilon(epsilon)
    prior_epsilon = check_epsilon(prior_epsilon, "prior_epsilon")
    if mechanism not in ("opt-unbiased", "rr-on-bins", "rr-with-prior"):
        raise LabelDPError("group releases use opt-unbiased, rr-on-bins or rr-with-prior", code="unknown_mechanism")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    body_hash = hashlib.sha256(canonical({"epsilon": epsilon, "prior_epsilon": prior_epsilon, "groups": digest,
                                          "mechanism": mechanism}).encode()).hexdigest()
    stored, snapshot = _begin_release(ctx, principal, dataset_id, idempotency_key, body_hash)
    if stored is not None:
        return stored, False
    ids, groups = parse_groups(path, fmt)
    rows, covered = _cover(ctx, dataset_id, snapshot, ids, epsilon)
    result = privatize_by_group(snapshot.domain, snapshot.labels[rows], groups, mechanism, epsilon,
                                secure_rng(), prior_epsilon=prior_epsilon)
    per_group = [{"group": str(key), "examples": int(np.sum(groups == key)),
                  "noisy_prior": part.prior.describe(), "certified_epsilon": part.mechanism.certified_epsilon,
                  "output_values": part.mechanism.describe(include_matrix=False)["output_values"]}
                 for key, part in zip(result.groups, result.parts, strict=True)]
    worst = max(part.mechanism.certified_epsilon for part in result.parts)
    description = {"mechanism": mechanism, "group_priors": True, "epsilon": epsilon, "prior_epsilon": prior_epsilon,
                   "certified_epsilon": result.certified_epsilon, "groups": per_group, "groups_sha256": digest}
    record = {"request": {"mechanism": mechanism, "epsilon": epsilon, "prior_epsilon": prior_epsilon,
                          "group_priors": True, "num_groups": len(result.groups)},
              "prior": {**{k: v for k, v in result.parts[0].prior.describe().items()
                           if k not in ("weights", "noisy_counts")},
                        "per_group": True, "composition": "parallel over disjoint groups"},
              "randomizer": {"epsilon": epsilon - prior_epsilon, "certified_epsilon": worst, "parameters": {}},
              "budget_split_rule": "override", "groups_sha256": digest,
              "dp_event": event_to_dict(dp_event.ComposedDpEvent([
                  prior_dp_event(result.parts[0].prior),  # every group's prior has the same calibration
                  LocalRandomizerDpEvent(mechanism=mechanism, epsilon=worst)]))}
    draft = _Draft(mechanism, epsilon, result.certified_epsilon, prior_epsilon, epsilon - prior_epsilon, covered,
                   {"label": result.noisy_labels}, description, None, record)
    return _commit_release(ctx, principal, dataset_id, idempotency_key, body_hash, snapshot, draft)


def central_training(ctx: ServiceContext, principal: Principal, dataset_id: str,
                     request: schemas.CentralTrainingRequest,
                     idempotency_key: str | None) -> tuple[schemas.Release, bool]:
    """Train with LabelDP-Pro here and return only the parameters; (ε, δ) is charged to the training examples
    (their ε adds to the per-example budget; δ is recorded in the ledger)."""
    # Imported here so that the labels service only loads JAX when central training is actually used.
    from labels_party.labeldp_pro import ProConfig, train_labeldp_pro
    from labels_party.labeldp_pro import dp_event as pro_event

    body_hash = hashlib.sha256(canonical(request.model_dump()).encode()).hexdigest()
    stored, snapshot = _begin_release(ctx, principal, dataset_id, idempotency_key, body_hash)
    if stored is not None:
        return stored, False
    if not snapshot.dataset.allow_central_training:
        raise LabelDPError("central training is not enabled for this dataset by its owner",
                           code="central_training_disabled")
    if not isinstance(snapshot.domain, Classes):
        raise LabelDPError("central training (LabelDP-Pro) needs a classes dataset", code="mechanism_domain_mismatch")
    rows, covered = _cover(ctx, dataset_id, snapshot, request.example_ids, request.epsilon)
    features = np.asarray(request.features, dtype=np.float32)
    if not np.all(np.isfinite(features)):
        raise LabelDPError("features must be finite numbers", code="invalid_request")
    config = ProConfig(denoiser=request.denoiser, epsilon=request.epsilon, delta=request.delta,
                       steps=request.steps, batch_size=min(request.batch_size, len(rows)),
                       learning_rate=request.learning_rate, hidden=tuple(request.hidden))
    result = train_labeldp_pro(config, features, snapshot.labels[rows].astype(np.int64),
                               snapshot.domain.num_classes, secure_rng())
    q = min(1.0, config.batch_size / len(rows))
    description = {"mechanism": "labeldp-pro", "denoiser": request.denoiser, "epsilon": request.epsilon,
                   "delta": request.delta, "certified_epsilon": result.epsilon, "noise_multiplier": result.sigma,
                   "steps": request.steps, "sampling_probability": q,
                   "parameters": jax_tree_to_lists(result.params), "hidden": request.hidden,
                   "num_classes": snapshot.domain.num_classes}
    record = {"request": request.model_dump(exclude={"example_ids", "features"}), "prior": None,
              "delta": request.delta,
              "randomizer": {"epsilon": request.epsilon, "certified_epsilon": result.epsilon,
                             "parameters": {"noise_multiplier": result.sigma, "sampling_probability": q}},
              "budget_split_rule": "no prior",
              "dp_event": event_to_dict(pro_event(result.sigma, q, request.steps, request.denoiser))}
    draft = _Draft("labeldp-pro", request.epsilon, result.epsilon, 0.0, request.epsilon, covered, {}, description,
                   None, record)
    return _commit_release(ctx, principal, dataset_id, idempotency_key, body_hash, snapshot, draft)


def jax_tree_to_lists(tree) -> dict:
    return {"embeddings": [np.asarray(e).tolist() for e in tree["embeddings"]],
            "layers": [{"w": np.asarray(layer["w"]).tolist(), "b": np.asarray(layer["b"]).tolist()}
                       for layer in tree["layers"]]}


def evaluate_predictions(ctx: ServiceContext, principal: Principal, dataset_id: str,
                         request: schemas.EvaluationRequest,
                         idempotency_key: str | None) -> tuple[schemas.Release, bool]:
    """Private evaluation (see :mod:`labels_party.evaluation`), accounted like a release of the scored examples."""
    body_hash = hashlib.sha256(canonical(request.model_dump()).encode()).hexdigest()
    stored, snapshot = _begin_release(ctx, principal, dataset_id, idempotency_key, body_hash)
    if stored is not None:
        return stored, False
    rows, covered = _cover(ctx, dataset_id, snapshot, request.example_ids, request.epsilon)
    result = evaluate(request.metric, request.predictions, snapshot.labels[rows], request.epsilon, request.clip,
                      secure_rng())
    low, high = result.confidence_interval()
    certified = result.certified_epsilon
    description = {"mechanism": "evaluation", "metric": result.metric, "value": result.value,
                   "noise_scale": result.noise_scale, "clip": result.clip, "num_examples": result.num_examples,
                   "ci95": [low, high], "epsilon": request.epsilon, "certified_epsilon": certified,
                   "noisy_sum": result.noisy_sum, "unit": result.unit, "loss_levels": result.levels,
                   "noise": result.noise.describe()}
    record = {"request": request.model_dump(exclude={"example_ids", "predictions"}), "prior": None,
              "randomizer": {"epsilon": request.epsilon, "certified_epsilon": certified,
                             "parameters": {"loss_levels": result.levels, "num_examples": result.num_examples}},
              "budget_split_rule": "no prior",
              "dp_event": event_to_dict(dp_event.ComposedDpEvent([dp_event.DiscreteLaplaceDpEvent(
                  noise_parameter=result.noise.s / result.noise.t, sensitivity=result.levels)]))}
    draft = _Draft("evaluation", request.epsilon, certified, 0.0, request.epsilon, covered, {}, description,
                   None, record)
    return _commit_release(ctx, principal, dataset_id, idempotency_key, body_hash, snapshot, draft)


def _budget_error(epsilon: float, remaining: float) -> LabelDPError:
    error = LabelDPError(f"budget exceeded: this release needs epsilon {epsilon:g}, the covered examples have "
                         f"{remaining:.6g} left", code="budget_exceeded")
    error.remaining = remaining
    return error


def get_release(ctx: ServiceContext, principal: Principal, release_id: str) -> tuple[schemas.Release, str]:
    with ctx.sessions() as session, session.begin():
        release = session.get(db.Release, release_id)
        if release is None:
            raise LabelDPError("no such release for this key", code="not_found")
        try:
            accessible_dataset(session, principal, release.dataset_id)
        except LabelDPError:
            raise LabelDPError("no such release for this key", code="not_found") from None
        return release_view(release), release.file
