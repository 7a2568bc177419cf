"""The kinds of release, each a strategy for :func:`labels_party.releases.transaction.run`: what it records, which
examples it covers and how it computes its draft from their labels. Idempotency, the budget, the charge and the
audit record come from the transaction, the same for all of them.

* :class:`LabelRelease` — one mechanism from the registry over the dataset's labels (or some of them);
* :class:`ExamplePriorRelease` — RRWithPrior with one prior per example (multi-stage training);
* :class:`GroupRelease` — one private prior and one randomizer per group of examples;
* :class:`Evaluation` — a noisy test loss of the caller's predictions;
* :class:`Quantiles` — DP quantiles of the labels, to choose clip bounds with;
* :class:`CentralTraining` — LabelDP-Pro trained here; only the parameters leave;
* :class:`PateRelease` — PATE's teachers trained here; their noisy votes label the caller's query rows.

Each kind prices itself from public inputs (``price``: every refusal it can make, and the event it is charged)
before the transaction charges it, and computes only afterwards (``compute``: never refuses).

Inputs a kind takes from the features party (example ids, priors, groups, predictions, features) must be
functions of features only; they choose what is released, never how much it costs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from dp_accounting import dp_event

from labels_party.core import pipeline, registry
from labels_party.core.evaluation import EvaluationPlan, plan_evaluation, score
from labels_party.core.pipeline import Plan, Prepared, privatize, privatize_by_group
from labels_party.core.quantiles import (
    QuantilePlan,
    RankCounts,
    at_least,
    check_ordered,
    check_quantiles,
    plan_quantiles,
    release_quantiles,
)
from labels_party.core.registry import MechanismOptions
from labels_party.core.solvers.rr_with_prior import PerExamplePlan, plan_per_example, sample_per_example
from labels_party.releases.lifecycle import Computation, Draft, Snapshot
from labels_party.releases.streamed import plan_version, write_example_ids
from labels_party.runtime.context import ServiceContext
from labels_party.store.uploads import (
    MAX_DECODED_BYTES,
    MAX_GROUP_NAME,
    held_id_size,
    parse_groups,
    parse_priors,
    prior_body_decoded,
    upload_format,
)
from shared import schemas
from shared.errors import ErrorCode, LabelDPError
from shared.service.budgets import Reservation
from shared.service.spool import SpooledBody

# A release naming its examples is sampled in memory: one of a column per class (subset, ALIBI: 8 bytes a cell)
# holds at most this many cells (128 MB of ALIBI's integers; 65,536 examples at 256 classes).
MAX_CLASS_COLUMN_CELLS = 1 << 24
MAX_FEATURE = 1e6  # central training's features: beyond it float32 training overflows (standardized ones are ~1)


# What a document holds besides its numeric arrays (field names, parameters, rules: a few kB), and per group of a
# group release besides its counts (its name, at most MAX_GROUP_NAME characters, size, ε and randomizer index).
DOCUMENT_OVERHEAD = 64 << 10
GROUP_OVERHEAD = 64 + MAX_GROUP_NAME


def check_document_size(ctx: ServiceContext, numbers: int, what: str, extra_bytes: int = 0) -> None:
    """Refuse, from public inputs only, a request whose mechanism document could exceed the deployment's
    ``max_document_bytes``: 8 bytes per number its mechanisms and priors may publish, plus the rest of the document
    (an upper bound on what :func:`labels_party.ledger.documents.pack` stores)."""
    predicted, limit = 8 * numbers + extra_bytes + DOCUMENT_OVERHEAD, ctx.settings.max_document_bytes
    if predicted > limit:
        raise LabelDPError(f"{what} may publish a mechanism document of {predicted:,} bytes; this deployment allows "
                           f"{limit:,} per request: use fewer groups, fewer labels or outputs, or a smaller model",
                           code=ErrorCode.DOCUMENT_TOO_LARGE)


def check_training_size(ctx: ServiceContext, per_step: int, total: int, fewer: str) -> None:
    """Refuse, from public inputs only, a central training (LabelDP-Pro's, PATE's teachers and votes) whose work
    (``total``) or one step's (``per_step``, in example-rows × model parameters) is beyond the deployment's limits: a
    run cannot be stopped once it started, and XLA's threads escape the per-organization CPU quota. ``fewer``: what
    to ask for instead."""
    settings = ctx.settings
    for size, limit, what in ((total, settings.max_central_training_size, "the run"),
                              (per_step, settings.max_central_training_step, "one step")):
        if size > limit:
            raise LabelDPError(f"{what} of this training is {size:,} example-rows × model parameters; this deployment "
                               f"allows {limit:,}: ask for {fewer}", code=ErrorCode.TRAINING_TOO_LARGE)


def finite_param_lists(params: dict) -> dict:
    """The parameters as JSON lists (the layout of :func:`shared.models.params_to_lists`) with every non-finite
    entry replaced by 0 — numpy only, so that this module does not load JAX."""
    def finite(value) -> list:
        return np.nan_to_num(np.asarray(value), nan=0.0, posinf=0.0, neginf=0.0).tolist()

    return {"embeddings": [finite(e) for e in params["embeddings"]],
            "layers": [{"w": finite(layer["w"]), "b": finite(layer["b"])} for layer in params["layers"]]}


@dataclass(frozen=True)
class PricedPlan:
    """A kind's preparation and the event it is charged (no private prior: ``prior_epsilon`` 0); a
    :class:`~labels_party.releases.lifecycle.Priced`."""

    event: dp_event.DpEvent
    plan: Any
    prior_epsilon: float = 0.0

    def dp_event(self) -> dp_event.DpEvent:
        return self.event


class _OneEpsilon(Protocol):
    @property
    def epsilon(self) -> float: ...


class _Defaults:
    """What most kinds share: one ε, nothing to check before the snapshot, the identity recorded as is."""

    def identity(self) -> dict:
        raise NotImplementedError

    def compute_version(self, snapshot: Snapshot, read: Callable[[], Iterator[pa.RecordBatch]], priced: Any,
                        run: Computation) -> Draft:
        """Only kinds whose ``inputs`` may cover the whole version (ids None) override this."""
        raise NotImplementedError

    def epsilons(self: _OneEpsilon) -> dict[str, float]:
        return {"epsilon": self.epsilon}

    def check(self) -> None:
        pass

    def covers(self, _inputs) -> np.ndarray | None:
        return None  # every example the request names

    def record(self) -> dict:
        return self.identity()


class _JsonBodyKind(_Defaults):
    """A kind whose request is one JSON body with an ε and per-example lists; the record keeps the body without
    those lists (the coverage records the examples)."""

    request: schemas.EvaluationRequest | schemas.CentralTrainingRequest | schemas.QuantilesRequest | \
        schemas.PateRequest
    per_example: ClassVar[frozenset[str]]

    @property
    def epsilon(self) -> float:
        return self.request.epsilon

    def identity(self) -> dict:
        return self.request.model_dump()

    def record(self) -> dict:
        return self.request.model_dump(exclude=set(self.per_example))


def _needs_classes(snapshot: Snapshot, what: str) -> int:
    """The dataset's number of classes; refused unless its labels are classes."""
    if snapshot.domain.label_kind != "classes":
        raise LabelDPError(f"{what} needs a classes dataset", code=ErrorCode.MECHANISM_DOMAIN_MISMATCH)
    return snapshot.domain.support().size


@dataclass(frozen=True)
class LabelRelease(_Defaults):
    request: schemas.ReleaseRequest

    @property
    def mechanism(self) -> str:
        return self.request.mechanism

    @property
    def epsilon(self) -> float:
        return self.request.epsilon

    def epsilons(self) -> dict[str, float]:
        prior = self.request.prior_epsilon
        return {"epsilon": self.epsilon, **({"prior_epsilon": prior} if prior is not None else {})}

    def identity(self) -> dict:
        return self.request.identity()

    def record(self) -> dict:
        return {key: value for key, value in self.request.identity().items() if key != "example_ids"}

    def inputs(self, snapshot: Snapshot):
        return self.request.example_ids, None

    def price(self, ctx: ServiceContext, snapshot: Snapshot, num_examples: int, _inputs) -> Prepared:
        request = self.request
        prepared = pipeline.prepare(snapshot.domain, request.mechanism, request.epsilon, num_examples,
                                    prior_epsilon=request.prior_epsilon,
                                    options=MechanismOptions(mesh=request.mesh, clip=request.clip,
                                                             solver=request.solver),
                                    allow_uninformative=request.allow_uninformative)
        size = snapshot.domain.support().size
        numbers = prepared.family.published_numbers(size, prepared.options)
        check_document_size(ctx, numbers + (2 * size if prepared.family.needs_prior else 0),  # the prior's
                            f"{request.mechanism} on {size:,} labels")
        cells = num_examples * size
        if prepared.family.column_per_class and request.example_ids is not None and cells > MAX_CLASS_COLUMN_CELLS:
            # sampled and written whole (a release of the whole version streams in chunks instead)
            raise LabelDPError(f"{request.mechanism} releases one column per class: {num_examples:,} examples × "
                               f"{size:,} classes is {cells:,} cells; at most {MAX_CLASS_COLUMN_CELLS:,} per request "
                               "that names its examples (fewer examples per request, or all of them)",
                               code=ErrorCode.TOO_LARGE)
        return prepared

    def compute(self, snapshot: Snapshot, labels: np.ndarray, _inputs, priced: Prepared, run: Computation) -> Draft:
        result = privatize(priced.with_deadline(run.deadline), labels, run.rng)
        noisy = result.noisy_labels
        assert noisy is not None  # privatize samples every label
        columns = ({f"in_class_{k}": noisy[:, k] for k in range(noisy.shape[1])} if noisy.ndim == 2  # sets, vectors
                   else {"label": noisy})
        return self.draft(result, columns)

    def compute_version(self, snapshot: Snapshot, read, priced: Prepared, run: Computation) -> Draft:
        streamed = plan_version(priced.with_deadline(run.deadline), read, run.rng)
        return self.draft(streamed.plan, {}, streamed.write)

    @staticmethod
    def draft(plan: Plan, columns: dict, write=None) -> Draft:
        return Draft(plan, columns, plan.describe(), plan.prior.describe() if plan.prior else None, write=write)


@dataclass(frozen=True)
class InformativePriors:
    """The plan of a per-example prior release: which of the requested examples it covers (k ≥ 2) and their
    RRWithPrior, decided from the priors alone."""

    covers: np.ndarray  # over the request's rows
    plan: PerExamplePlan  # of the covered examples, in their order

    @property
    def left_out(self) -> int:
        return int(self.covers.size - self.covers.sum())


@dataclass(frozen=True)
class ExamplePriorShape(_Defaults):
    """A release check's per-example prior release to come (an LP-MST stage whose priors the model has not given
    yet): refused as :class:`ExamplePriorRelease` would be on everything but its priors — a classes dataset, ε, the
    ids, and the bytes its body decodes to with one prior over each of the K classes per example (what
    :func:`~labels_party.store.uploads.parse_priors` counts of a CSV or NDJSON body; a Parquet body's columns count
    their stored pages too). Never charged or computed: only checked."""

    request: schemas.PriorReleaseShape
    max_decoded_bytes: int = MAX_DECODED_BYTES
    mechanism: str = "rr-with-prior"

    @property
    def epsilon(self) -> float:
        return self.request.epsilon

    def identity(self) -> dict:
        return self.request.model_dump()

    def inputs(self, snapshot: Snapshot) -> tuple[list[str], None]:
        ids = self.request.example_ids
        prior_body_decoded(_needs_classes(snapshot, "per-example priors"), snapshot.num_examples,
                           self.max_decoded_bytes).add(rows=len(ids), strings=sum(map(held_id_size, ids)))
        return ids, None

    def price(self, _ctx: ServiceContext, _snapshot: Snapshot, _num_examples: int, _inputs) -> PricedPlan:
        return PricedPlan(dp_event.NoOpDpEvent(), None)  # checked only: never charged

    def compute(self, snapshot: Snapshot, labels: np.ndarray, _inputs, priced: PricedPlan, run: Computation) -> Draft:
        raise AssertionError("a prior release's shape is checked, never released")


@dataclass(frozen=True)
class ExamplePriorRelease(_Defaults):
    """The priors arrive as a columnar body (example_id, p_0..p_{K-1}) computed from features only — inputs the
    features party chooses, like the subset of examples, and not privacy-relevant as long as they are.

    **Examples whose prior gives k = 1 are neither charged nor released.** RR-Top-1 releases the prior's most
    likely class whatever the label, so such an example's output says nothing about its label. k is decided per
    example from the priors and ε (:meth:`PerExamplePlan.informative`) before the coverage is computed; the
    release covers — charges, samples and writes — the examples with k ≥ 2 only, and its description states how
    many were left out. Why this is private:

    * the set left out is a deterministic function of the priors and ε, which are public to the analysis (they
      come from features, and the features party sends them): leaving an example out, and the count of them
      published, reveal nothing about any label. Its labels were read by the lookup (which refuses unknown ids,
      as for every requested id) but enter nothing that is published or charged;
    * for two datasets that differ in the label of one left-out example, every output — the covered examples'
      labels, the description, the charge and any refusal — has the same distribution: it costs 0, and nothing
      is charged on it (its budget is untouched);
    * each covered example gets exactly the randomizer and the charge it had before (ε-DP RR-Top-k with k ≥ 2 of
      its prior; the certified ε is the same max, k = 1 adding 0 to it): the covered examples are charged as
      before.

    What the left-out examples would have "released" is their prior's most likely class: the features party
    computes it from its own priors (LP-MST does, :mod:`features_party.multistage`). If every example has k = 1 the
    request is refused (``uninformative_release``) before any label is read or anything charged.
    """

    epsilon: float
    priors: SpooledBody
    memory: Reservation  # the request's share of the process's memory for such bodies (its limit: one body's)
    mechanism: str = "rr-with-prior"

    def identity(self) -> dict:
        return {"mechanism": self.mechanism, "epsilon": self.epsilon, "per_example_priors": True,
                "priors_sha256": self.priors.sha256}

    def inputs(self, snapshot: Snapshot) -> tuple[list[str], InformativePriors]:
        num_classes = _needs_classes(snapshot, "per-example priors")
        ids, priors = parse_priors(self.priors.path, upload_format(self.priors.media_type), num_classes,
                                   max_rows=snapshot.num_examples, max_bytes=self.memory.limit, memory=self.memory)
        covers, plan = plan_per_example(priors, self.epsilon).informative()
        if not covers.any():  # decided by the priors (public: from features), before the ids are even looked up
            raise LabelDPError("every example's prior puts k = 1: each label would be released as its prior's most "
                               "likely class, whatever it is, so the release would carry no information for epsilon "
                               f"{self.epsilon:g}: use a larger epsilon or less confident priors",
                               code=ErrorCode.UNINFORMATIVE_RELEASE)
        return ids, InformativePriors(covers, plan)

    def covers(self, priors: InformativePriors) -> np.ndarray:
        return priors.covers

    def price(self, _ctx: ServiceContext, _snapshot: Snapshot, _num_examples: int,
              priors: InformativePriors) -> PricedPlan:
        return PricedPlan(priors.plan.dp_event(), priors)

    def compute(self, snapshot: Snapshot, labels: np.ndarray, _priors, priced: PricedPlan, run: Computation) -> Draft:
        priors: InformativePriors = priced.plan
        result = sample_per_example(priors.plan, labels.astype(np.int64), run.rng)
        description = {"mechanism": self.mechanism, "per_example_priors": True, "epsilon": self.epsilon,
                       "certified_epsilon": result.certified_epsilon, "mean_k": float(result.k.mean()),
                       "k_histogram": np.bincount(result.k, minlength=snapshot.domain.support().size + 1)[1:].tolist(),
                       "requested_examples": int(priors.covers.size),
                       "uninformative_examples": priors.left_out,
                       "uninformative_rule": "left out, neither charged nor released: exactly the requested examples "
                                             "whose prior gives k = 1 at this epsilon (computable from the priors); "
                                             "RR-Top-1 would have released their prior's most likely class, "
                                             "whatever the label. mean_k and k_histogram count the released ones",
                       "priors_sha256": self.priors.sha256,
                       "budget_split_rule": "priors come from features: no budget spent on them"}
        return Draft(result, {"label": result.outputs.astype(np.float64)}, description)


@dataclass(frozen=True)
class GroupRelease(_Defaults):
    """The body assigns each example to a group computed from features (example_id, group); each group gets its
    own discrete-Laplace prior (ε_p, parallel across the disjoint groups) and its own randomizer at ε − ε_p:
    RRWithPrior for classes, the optimal unbiased randomizer (or RR-on-Bins) for regression."""

    mechanism: str
    epsilon: float
    prior_epsilon: float
    groups: SpooledBody
    memory: Reservation  # as ExamplePriorRelease's

    def epsilons(self) -> dict[str, float]:
        return {"epsilon": self.epsilon, "prior_epsilon": self.prior_epsilon}

    def identity(self) -> dict:
        return {"mechanism": self.mechanism, "epsilon": self.epsilon, "prior_epsilon": self.prior_epsilon,
                "group_priors": True, "groups_sha256": self.groups.sha256}

    def check(self) -> None:
        if not registry.family(self.mechanism).needs_prior:  # a group release is one private prior per group
            with_prior = ", ".join(f.name for f in registry.FAMILIES.values() if f.needs_prior)
            raise LabelDPError(f"group releases use a mechanism with a prior: {with_prior}",
                               code=ErrorCode.UNKNOWN_MECHANISM)

    def inputs(self, snapshot: Snapshot):
        return parse_groups(self.groups.path, upload_format(self.groups.media_type), max_rows=snapshot.num_examples,
                            max_bytes=self.memory.limit, memory=self.memory)

    def price(self, ctx: ServiceContext, snapshot: Snapshot, _num_examples: int, groups) -> Prepared:
        """Also bounds the work and the document, which grow with the groups (public: they come from features):
        each gets a prior, a solve (or its fallback) and its randomizer and noisy counts in the document."""
        prepared = pipeline.prepare_groups(snapshot.domain, self.mechanism, self.epsilon,
                                           prior_epsilon=self.prior_epsilon)
        count, limit = int(np.unique(np.asarray(groups)).size), ctx.settings.max_groups_per_release
        if count > limit:
            raise LabelDPError(f"{count:,} groups: a group release on this deployment takes at most {limit:,} "
                               "(max_groups_per_release); merge groups", code=ErrorCode.TOO_MANY_GROUPS)
        size = snapshot.domain.support().size
        per_group = prepared.family.published_numbers(size, prepared.options) + size  # its randomizer, its counts
        check_document_size(ctx, count * per_group + size, f"{count:,} groups of {self.mechanism} on {size:,} labels",
                            extra_bytes=count * GROUP_OVERHEAD)
        return prepared

    def compute(self, snapshot: Snapshot, labels: np.ndarray, groups, priced: Prepared, run: Computation) -> Draft:
        result = privatize_by_group(priced.with_deadline(run.deadline), labels, groups, run.rng)
        description = {"mechanism": self.mechanism, "group_priors": True, "epsilon": self.epsilon,
                       "prior_epsilon": self.prior_epsilon, "certified_epsilon": result.certified_epsilon,
                       "num_groups": len(result.groups), "groups_sha256": self.groups.sha256,
                       "budget_split_rule": "override; the groups compose in parallel", **result.describe()}
        return Draft(result, {"label": result.noisy_labels}, description)


@dataclass(frozen=True)
class Evaluation(_JsonBodyKind):
    """Private evaluation (see :mod:`labels_party.core.evaluation`), accounted like a release of the scored
    examples."""

    request: schemas.EvaluationRequest
    mechanism: str = "evaluation"
    per_example: ClassVar[frozenset[str]] = frozenset({"example_ids", "predictions"})

    def check(self) -> None:
        predictions = self.request.predictions
        if self.request.metric == "mean":
            if predictions is not None:
                raise LabelDPError("the mean metric scores the labels themselves: send no predictions",
                                   code=ErrorCode.INVALID_INPUT)
        elif predictions is None or len(self.request.example_ids) != len(predictions):
            raise LabelDPError("predictions must hold one number per example id", code=ErrorCode.INVALID_INPUT)

    def inputs(self, snapshot: Snapshot):
        return self.request.example_ids, self.request.predictions

    def price(self, _ctx: ServiceContext, snapshot: Snapshot, _num_examples: int, _predictions) -> PricedPlan:
        plan = plan_evaluation(self.request.metric, self.request.epsilon, self.request.clip, snapshot.domain)
        return PricedPlan(plan.dp_event(), plan)

    def compute(self, snapshot: Snapshot, labels: np.ndarray, predictions, priced: PricedPlan,
                run: Computation) -> Draft:
        request = self.request
        plan: EvaluationPlan = priced.plan
        result = score(plan, predictions, labels, run.rng)
        low, high = result.confidence_interval()
        description = {"mechanism": self.mechanism, "metric": result.metric, "value": result.value,
                       "noise_scale": result.noise_scale, "clip": result.clip, "num_examples": result.num_examples,
                       "ci95_low": low, "ci95_high": high, "epsilon": request.epsilon,
                       "certified_epsilon": result.certified_epsilon, "noisy_sum": result.noisy_sum,
                       "unit": result.unit, "loss_levels": result.levels, "noise": result.noise.describe(),
                       **({"range_low": plan.bounds[0], "range_high": plan.bounds[1]} if plan.bounds else {})}
        return Draft(result, {}, description)


@dataclass(frozen=True)
class Quantiles(_JsonBodyKind):
    """DP quantiles of the covered labels on the dataset's declared domain (:mod:`labels_party.core.quantiles`),
    accounted like a release of those examples; the release's file lists them, as an evaluation's does."""

    request: schemas.QuantilesRequest
    mechanism: str = "quantiles"
    per_example: ClassVar[frozenset[str]] = frozenset({"example_ids"})

    def identity(self) -> dict:
        return self.request.identity()

    def record(self) -> dict:
        return {key: value for key, value in self.request.identity().items() if key not in self.per_example}

    def check(self) -> None:
        check_quantiles(self.request.quantiles)

    def inputs(self, snapshot: Snapshot):
        check_ordered(snapshot.domain)  # a refusal on the domain, before the ids' labels are looked up
        return self.request.example_ids, None

    def price(self, _ctx: ServiceContext, snapshot: Snapshot, _num_examples: int, _inputs) -> PricedPlan:
        plan = plan_quantiles(snapshot.domain, self.request.quantiles, self.request.epsilon,
                              self.request.candidates, self.request.method)
        return PricedPlan(plan.dp_event(), plan)

    # Counting the ranks and the draws take a time that depends on the labels; the response's must not: both run
    # inside the plan's floor for the (public) number of covered labels.
    def compute(self, snapshot: Snapshot, labels: np.ndarray, _inputs, priced: PricedPlan,
                run: Computation) -> Draft:
        plan: QuantilePlan = priced.plan
        with at_least(plan.floor_seconds(len(labels))):
            counts = RankCounts(plan.candidates)
            counts.add(labels)
            result = release_quantiles(plan, counts, run.rng)
        return Draft(result, {}, result.describe())

    def compute_version(self, snapshot: Snapshot, read, priced: PricedPlan, run: Computation) -> Draft:
        plan: QuantilePlan = priced.plan
        with at_least(plan.floor_seconds(snapshot.num_examples)):
            counts = RankCounts(plan.candidates)
            for batch in read():
                counts.add(batch.column("label").to_numpy(zero_copy_only=False))
            result = release_quantiles(plan, counts, run.rng)
        return Draft(result, {}, result.describe(), write=write_example_ids(read))


@dataclass(frozen=True)
class CentralTraining(_JsonBodyKind):
    """LabelDP-Pro trained here on the caller's features; only the parameters leave. The noise is calibrated to
    (ε, δ) before any label is read, and the run is charged its RDP curve, converted at the organization's δ
    allocation (:mod:`labels_party.ledger`): many trainings compose as the accountant says, not by adding ε."""

    request: schemas.CentralTrainingRequest
    mechanism: str = "labeldp-pro"
    per_example: ClassVar[frozenset[str]] = frozenset({"example_ids", "features"})

    def check(self) -> None:
        features = self.request.features
        if len(self.request.example_ids) != len(features) or len({len(f) for f in features}) != 1:
            raise LabelDPError("features must hold one vector per example id, all of the same length",
                               code=ErrorCode.INVALID_INPUT)
        if max((abs(v) for row in features for v in row), default=0.0) > MAX_FEATURE:
            raise LabelDPError(f"features must lie in [-{MAX_FEATURE:g}, {MAX_FEATURE:g}] (standardize them): "
                               "larger ones overflow float32 training", code=ErrorCode.INVALID_INPUT)

    def inputs(self, snapshot: Snapshot):
        if not snapshot.dataset.allow_central_training:
            raise LabelDPError("central training is not enabled for this dataset by its owner",
                               code=ErrorCode.CENTRAL_TRAINING_DISABLED)
        _needs_classes(snapshot, "central training (LabelDP-Pro)")
        return self.request.example_ids, np.asarray(self.request.features, dtype=np.float32)

    def price(self, ctx: ServiceContext, snapshot: Snapshot, num_examples: int, _features) -> PricedPlan:
        # Imported here so that the labels service only loads JAX when central training is actually used.
        from labels_party.core import labeldp_pro
        from shared import models

        request = self.request
        delta = _delta_allowed(request.delta, snapshot.delta)
        config = labeldp_pro.ProConfig(denoiser=request.denoiser, epsilon=request.epsilon, delta=delta,
                                       steps=request.steps, batch_size=min(request.batch_size, num_examples),
                                       learning_rate=request.learning_rate, hidden=tuple(request.hidden))
        spec = labeldp_pro.model_spec(len(request.features[0]) if request.features else 0, request.hidden,
                                      snapshot.domain.support().size)
        num_params = models.num_params(spec)
        check_training_size(ctx, *labeldp_pro.training_size(config, num_examples, num_params),
                            "fewer steps, a smaller batch or a smaller model")
        check_document_size(ctx, num_params, f"a model of {num_params:,} parameters")  # its weights and biases
        q = min(1.0, config.batch_size / num_examples)
        try:
            sigma = labeldp_pro.calibrate_sigma(config.epsilon, config.delta, q, config.steps, config.denoiser)
        except (ValueError, RuntimeError):
            raise LabelDPError(f"no noise level gives ({request.epsilon:g}, {delta:g})-DP for {request.steps} steps at "
                               "this batch size: ask for a larger epsilon or fewer steps",
                               code=ErrorCode.EPSILON_OUT_OF_RANGE) from None
        return PricedPlan(labeldp_pro.dp_event(sigma, q, config.steps, config.denoiser), (config, sigma))

    def compute(self, snapshot: Snapshot, labels: np.ndarray, features, priced: PricedPlan, run: Computation) -> Draft:
        from labels_party.core.labeldp_pro import train_labeldp_pro

        request, num_classes = self.request, snapshot.domain.support().size  # a classes domain (inputs)
        config, sigma = priced.plan
        result = train_labeldp_pro(config, features, labels.astype(np.int64), num_classes, run.rng, sigma=sigma)
        # The parameters are the DP output; mapping a non-finite one to 0 is post-processing, and it keeps the
        # outcome (a document that serializes, 201) from depending on whether training overflowed.
        params = finite_param_lists(result.params)
        description = {"mechanism": self.mechanism, "denoiser": request.denoiser, "epsilon": request.epsilon,
                       "delta": config.delta, "certified_epsilon": result.epsilon, "noise_multiplier": result.sigma,
                       "steps": request.steps, "sampling_probability": result.sampling_probability,
                       "parameters": params, "hidden": request.hidden,
                       "num_classes": num_classes}
        return Draft(result, {}, description)


def _delta_allowed(request_delta: float | None, allocated: float) -> float:
    """The δ a central run is calibrated for: the request's, at most the organization's allocation (its default)."""
    if allocated <= 0:
        raise LabelDPError("central training has delta > 0 and this organization has no delta allocation on "
                           "this dataset (its owner sets one with the grant)", code=ErrorCode.DELTA_NOT_ALLOCATED)
    delta = request_delta if request_delta is not None else allocated
    if delta > allocated:
        raise LabelDPError(f"delta {delta:g} is above this organization's delta allocation on this dataset, "
                           f"{allocated:g}", code=ErrorCode.INVALID_EPSILON)
    return delta


@dataclass(frozen=True)
class GnMaxCertificate:
    """The ε PATE's accountant gives its votes at the run's δ (what the release certifies)."""

    certified_epsilon: float


@dataclass(frozen=True)
class PateRelease(_JsonBodyKind):
    """PATE here (:mod:`labels_party.core.pate`): teachers on the caller's features of the labelled examples, their
    noisy votes released as one label per query row. Charged to every labelled example (each is in one teacher's part,
    whose votes on every query it may change) its RDP curve, converted at the organization's δ."""

    request: schemas.PateRequest
    mechanism: str = "pate-fm"
    per_example: ClassVar[frozenset[str]] = frozenset({"example_ids", "features", "query_ids", "query_features"})

    def check(self) -> None:
        request = self.request
        rows = [*request.features, *request.query_features]
        if len(request.example_ids) != len(request.features) or len(request.query_ids) != len(
                request.query_features) or len({len(f) for f in rows}) != 1:
            raise LabelDPError("features and query_features must hold one vector per id, all of the same length",
                               code=ErrorCode.INVALID_INPUT)
        if max((abs(v) for row in rows for v in row), default=0.0) > MAX_FEATURE:
            raise LabelDPError(f"features must lie in [-{MAX_FEATURE:g}, {MAX_FEATURE:g}] (standardize them): "
                               "larger ones overflow float32 training", code=ErrorCode.INVALID_INPUT)
        if len(set(request.query_ids)) != len(request.query_ids):
            raise LabelDPError("query_ids must be distinct", code=ErrorCode.INVALID_INPUT)
        if request.teachers > len(request.example_ids):
            raise LabelDPError(f"{request.teachers} teachers need at least as many labelled examples; "
                               f"{len(request.example_ids)} were sent", code=ErrorCode.INVALID_INPUT)

    def inputs(self, snapshot: Snapshot):
        if not snapshot.dataset.allow_central_training:
            raise LabelDPError("central training is not enabled for this dataset by its owner",
                               code=ErrorCode.CENTRAL_TRAINING_DISABLED)
        _needs_classes(snapshot, "PATE")
        return self.request.example_ids, (np.asarray(self.request.features, dtype=np.float32),
                                          np.asarray(self.request.query_features, dtype=np.float32))

    def price(self, ctx: ServiceContext, snapshot: Snapshot, num_examples: int, inputs) -> PricedPlan:
        from labels_party.core import pate  # JAX only where PATE is used

        request = self.request
        config = pate.PateConfig(teachers=request.teachers, epsilon=request.epsilon,
                                 delta=_delta_allowed(request.delta, snapshot.delta), steps=request.steps,
                                 learning_rate=request.learning_rate)
        classes, queries = snapshot.domain.support().size, len(request.query_ids)
        if queries * classes > pate.MAX_VOTE_CELLS:
            raise LabelDPError(f"{queries:,} queries × {classes:,} classes of votes; at most {pate.MAX_VOTE_CELLS:,} "
                               "per request (send fewer queries per request)", code=ErrorCode.TOO_LARGE)
        check_training_size(ctx, *pate.training_size(config, num_examples, inputs[0].shape[1], classes, queries),
                            "fewer steps, examples, queries or features")
        try:
            variance = pate.calibrate_variance(config.epsilon, config.delta, queries)
        except (ValueError, RuntimeError):
            raise LabelDPError(f"no noise level gives ({request.epsilon:g}, {config.delta:g})-DP for {queries:,} "
                               "queries: ask for a larger epsilon or fewer queries",
                               code=ErrorCode.EPSILON_OUT_OF_RANGE) from None
        return PricedPlan(pate.dp_event(math.sqrt(variance), queries), (config, variance))

    def compute(self, snapshot: Snapshot, labels: np.ndarray, inputs, priced: PricedPlan, run: Computation) -> Draft:
        from labels_party.core import pate

        features, queries = inputs
        (config, variance), classes = priced.plan, snapshot.domain.support().size
        assignment = pate.partition(features.shape[0], config.teachers, run.rng)
        weights, biases = pate.train_teachers(features, labels.astype(np.int64), assignment, classes, config)
        released = pate.aggregate(pate.votes(weights, biases, queries), variance, run.rng)
        certified = pate.epsilon_of(math.sqrt(variance), len(self.request.query_ids), config.delta)
        table = pa.table({"example_id": pa.array(self.request.query_ids, pa.string()),
                          "label": released.astype(np.float64)})
        description = {"mechanism": self.mechanism, "epsilon": config.epsilon, "delta": config.delta,
                       "certified_epsilon": certified, "teachers": config.teachers, "queries": table.num_rows,
                       "vote_noise": "discrete-gaussian", "variance": variance, "noise_std": math.sqrt(variance),
                       "sensitivity_l2": math.sqrt(2), "teacher_model": "multinomial logistic regression",
                       "steps": config.steps, "learning_rate": config.learning_rate, "num_classes": classes}
        return Draft(GnMaxCertificate(certified), {}, description,
                     write=lambda path: pq.write_table(table, path, compression="zstd"))
