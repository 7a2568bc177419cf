"""Wire schemas shared by the labels-party service and its clients (pydantic v2).

Field names here are the public contract: a created dataset and a release have ``id``; a release has
``epsilon`` and ``certified_epsilon``; a budget has ``epsilon_total``, ``epsilon_spent``, ``epsilon_remaining``;
the audit has ``events`` and ``chain_valid``; errors are ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, model_validator

from shared.domains import LABEL_VALUE_LIMIT, domain_spec

LabelKind = Literal["finite", "integer", "continuous", "classes"]



@dataclass(frozen=True)
class MechanismKinds:
    """What a mechanism a release may name takes: regression labels (finite, integer, continuous), class labels,
    and whether it builds on a noisy prior of the labels (so a group release, one prior per group, may use it)."""

    regression: bool
    classes: bool
    prior: bool


# Every mechanism a release may name, declared once: both parties check a request against this table, and the
# labels party's registry (labels_party.core.registry) builds each of them, its label kinds and prior taken from here.
MECHANISMS: Mapping[str, MechanismKinds] = MappingProxyType({
    "opt-unbiased": MechanismKinds(regression=True, classes=False, prior=True),
    "rr-on-bins": MechanismKinds(regression=True, classes=False, prior=True),
    "laplace": MechanismKinds(regression=True, classes=False, prior=False),
    "staircase": MechanismKinds(regression=True, classes=False, prior=False),
    "dbrr": MechanismKinds(regression=True, classes=False, prior=False),
    "rr": MechanismKinds(regression=True, classes=True, prior=False),
    "rr-with-prior": MechanismKinds(regression=False, classes=True, prior=True),
    "subset": MechanismKinds(regression=False, classes=True, prior=False),
    "rp-with-prior": MechanismKinds(regression=True, classes=False, prior=True),
    "block-rr": MechanismKinds(regression=False, classes=True, prior=True),
    "alibi": MechanismKinds(regression=False, classes=True, prior=False),
})
if TYPE_CHECKING:  # the type checker sees names; pydantic and the OpenAPI see the table's names as an enum
    MechanismName: TypeAlias = str
    GroupMechanism: TypeAlias = str
else:
    MechanismName = Literal[tuple(MECHANISMS)]
    # A group release estimates a prior per group and builds one prior-using randomizer per group.
    GroupMechanism = Literal[tuple(name for name, kinds in MECHANISMS.items() if kinds.prior)]
REGRESSION_MECHANISMS: tuple[str, ...] = tuple(name for name, kinds in MECHANISMS.items() if kinds.regression)
CLASSIFICATION_MECHANISMS: tuple[str, ...] = tuple(name for name, kinds in MECHANISMS.items() if kinds.classes)
# Privacy events recorded like releases that publish no labels: a noisy test loss, trained parameters, DP quantiles.
LABELLESS_RELEASES = ("evaluation", "labeldp-pro", "quantiles")
# Central releases that do publish class labels (of the rows the caller named): a student trains on them by id.
CENTRAL_CLASS_RELEASES = ("pate-fm",)
# opt-unbiased's solvers: outputs anywhere in ℝ (cone programs, certified gap) or on a fixed mesh (one LP)
Solver = Literal["continuous", "mesh"]


# Every request body: unknown fields are refused, and so is a value of the wrong JSON type (strict mode): `true` or
# `"1"` is not ε = 1 (a client's bug must not be charged as a release); an integer is still a number.
REQUEST_CONFIG = ConfigDict(extra="forbid", strict=True)
# Lists a request may make long validate with fail_fast: one wrong element is the answer (the first error is all the
# API reports), never one error per element (~700 bytes each: 3·10⁵ of them took 210 MB, issue 40).


def _integral(value: Any) -> Any:
    return int(value) if type(value) is float and value.is_integer() else value


# An integer a request carries, with its bounds: ``Annotated[int, Field(ge=…, le=…), INTEGRAL]``. For the same
# reason, ``30.0`` is the integer 30 (JSON Schema's "integer" includes it, and generated clients send it); ``30.5``,
# ``true`` and ``"30"`` are refused. The bounds go before the validator, or the OpenAPI schema would lose them.
INTEGRAL = BeforeValidator(_integral)


_T = TypeVar("_T")
if TYPE_CHECKING:
    # A field a request may leave out (then None) but not send as null.
    Omittable: TypeAlias = _T | None
else:
    class Omittable:
        """``Omittable[X]`` is X to pydantic: a null is refused and the schema says X (a value or nothing, with its
        default). The type checker sees ``X | None``: the None a left-out field holds."""

        def __class_getitem__(cls, item: Any) -> Any:
            return item


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


class ReadyBody(BaseModel):
    """``GET /readyz`` when every check passed (each named, ``"ok"``); otherwise the error body, 503 not_ready."""

    status: Literal["ready"]
    checks: dict[str, Literal["ok"]]


# Numbers a request carries: NaN and ±inf are refused, and the OpenAPI schema says so (``exclusiveMinimum``).
PositiveFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
# A label value a domain declares: within ±10¹⁵ (shared.domains.LABEL_VALUE_LIMIT says why), stated in the schema.
LabelValue = Annotated[float, Field(ge=-LABEL_VALUE_LIMIT, le=LABEL_VALUE_LIMIT, allow_inf_nan=False)]

# A privacy parameter a request asks for: any finite number parses; the service refuses one outside its range
# (settings.epsilon_min/max, inside what the mechanisms certify) with 400 epsilon_out_of_range, and its OpenAPI
# schema states that range.
Epsilon = FiniteFloat

_DECIMAL = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def _decimal(value: Any) -> Any:
    """A query parameter's text must be a plain decimal: Python's float() also reads "1_0" (10) and " 1 "."""
    if isinstance(value, str) and not _DECIMAL.fullmatch(value):
        raise ValueError("must be a decimal number such as 0.5 or 1e-3")
    return value


# An ε in a query string (the columnar releases): the same number, from its text as strictly as JSON reads it.
QueryEpsilon = Annotated[FiniteFloat, BeforeValidator(_decimal)]


# A per-example δ: a probability below 1 (the service's ceiling, LABELDP_DELTA_MAX, is far smaller).
Delta = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]

# A dataset's total budget: at most 10⁶ so its exact units (10⁻⁹ ε each, ``labels_party.ledger``) stay far inside a
# signed 64-bit column; no meaningful guarantee is anywhere near it.
BudgetEpsilon = Annotated[PositiveFinite, Field(le=1e6)]


class _DatasetCreateBase(BaseModel):
    model_config = REQUEST_CONFIG

    name: str = Field(min_length=1, max_length=200)
    epsilon_total: BudgetEpsilon
    # Per example, for mechanisms with δ > 0 (central training). At most the service's ceiling
    # (LABELDP_DELTA_MAX, 10⁻⁶ by default); 0: no such mechanism may run on this dataset.
    delta_total: Delta = 0.0
    allow_central_training: bool = False
    # Absent for uploaded labels. A local Parquet dataset (example_id, label), copied when registered (no symbolic
    # links; labels_party.spark.snapshot) and counted by Spark; only locations the operator allowed the organization.
    source: Omittable[Annotated[str, Field(min_length=1, max_length=1000, description=(
        "labels in a local Parquet dataset: a path or file: URI under a prefix this service allows the organization "
        "(LABELDP_SPARK_SOURCES), holding no symbolic link; copied and counted when registered (refusals of its "
        "labels come back here), releases then run as Spark jobs on the copy; integer and classes labels. Object "
        "stores (s3a://) and HDFS are not supported"))]] \
        = None


class FiniteDatasetCreate(_DatasetCreateBase):
    """Labels from an explicit list of values."""

    label_kind: Literal["finite"]
    values: list[LabelValue] = Field(min_length=2, max_length=100_000, fail_fast=True)

    def domain_spec(self) -> dict:
        return domain_spec("finite", values=self.values)


class LabelClip(BaseModel):
    """The dataset's declared public preprocessing: uploads move labels below ``low`` up to it and labels above
    ``high`` down to it (and say how many), instead of refusing them. The bounds are the label domain's; they must
    not be chosen by looking at these labels undisguised (see the README, "Your own data")."""

    model_config = REQUEST_CONFIG

    low: LabelValue
    high: LabelValue


class _BoundedDatasetCreate(_DatasetCreateBase):
    """Labels in ``[min, max]``, given as ``min`` and ``max``, or as ``clip`` (the same bounds, and out-of-range
    labels are clipped at upload instead of refused) — one or the other, so the schema states it."""

    # The two forms, in the OpenAPI schema too (so that a client, and Schemathesis, can know what is accepted).
    model_config = ConfigDict(json_schema_extra={"oneOf": [
        {"required": ["min", "max"], "not": {"required": ["clip"]}},
        {"required": ["clip"], "not": {"anyOf": [{"required": ["min"]}, {"required": ["max"]}]}}]})

    # Absent, not null: the schema says a number or nothing (a null would be schema-invalid data).
    min: Omittable[LabelValue] = None
    max: Omittable[LabelValue] = None
    clip: Omittable[LabelClip] = None

    @model_validator(mode="after")
    def _one_form(self):
        if self.clip is not None and (self.min is not None or self.max is not None):
            raise ValueError("give min and max, or clip: {low, high} (its bounds are the domain's), not both")
        if self.clip is None and (self.min is None or self.max is None):
            raise ValueError("give min and max, or clip: {low, high}")
        return self

    @property
    def bounds(self) -> tuple[float, float]:
        if self.clip is not None:
            return self.clip.low, self.clip.high
        assert self.min is not None and self.max is not None  # _one_form: without clip, both are given
        return self.min, self.max

    def _with_clip(self, spec: dict) -> dict:
        return {**spec, "clip": self.clip.model_dump()} if self.clip is not None else spec


class IntegerDatasetCreate(_BoundedDatasetCreate):
    """Integer labels ``min..max``; with ``grid_size``, released on that grid over ``[min, max]`` instead (wide
    ranges: see the README's limits table)."""

    label_kind: Literal["integer"]
    grid_size: Annotated[int, Field(ge=2, le=10_000), INTEGRAL] | None = None

    def domain_spec(self) -> dict:
        low, high = self.bounds
        if self.grid_size is not None:
            return self._with_clip(domain_spec("continuous", low=low, high=high, grid_size=self.grid_size))
        return self._with_clip(domain_spec("integer", low=low, high=high))


class ContinuousDatasetCreate(_BoundedDatasetCreate):
    """Real labels in ``[min, max]`` (released on a grid of ``grid_size`` points)."""

    label_kind: Literal["continuous"]
    grid_size: Annotated[int, Field(ge=2, le=10_000), INTEGRAL] = 101

    def domain_spec(self) -> dict:
        low, high = self.bounds
        return self._with_clip(domain_spec("continuous", low=low, high=high, grid_size=self.grid_size))


class ClassesDatasetCreate(_DatasetCreateBase):
    """Class labels ``0..num_classes-1``."""

    label_kind: Literal["classes"]
    num_classes: Annotated[int, Field(ge=2, le=100_000), INTEGRAL]

    def domain_spec(self) -> dict:
        return domain_spec("classes", num_classes=self.num_classes)


# The body of ``POST /v1/datasets``: which fields a dataset needs depends on its label kind, and the schema says so.
DatasetCreate = Annotated[
    FiniteDatasetCreate | IntegerDatasetCreate | ContinuousDatasetCreate | ClassesDatasetCreate,
    Field(discriminator="label_kind"),
]
dataset_create = TypeAdapter(DatasetCreate)


class Dataset(BaseModel):
    id: str
    name: str
    label_kind: LabelKind
    domain: dict[str, Any]
    # the owner's admins see the dataset's budget; a consumer its organization's allocation (see Budget)
    epsilon_total: float
    epsilon_spent: float
    epsilon_remaining: float
    delta_total: float
    num_examples: int
    label_version: int
    created_at: datetime
    labels_at: Literal["service", "source"] = "service"  # "source": a Parquet dataset released by Spark jobs
    # a source dataset is "registering" while its copy is taken and counted, then "ready" or "failed" (its error,
    # {"code", "message"}, shown to its owner's admins); releases need "ready" (409 dataset_not_ready)
    state: Literal["registering", "ready", "failed"] = "ready"
    error: dict[str, str] | None = None


class UploadResult(BaseModel):
    dataset_id: str
    label_version: int
    num_examples: int
    new_examples: int
    clipped_below: int = Field(description="labels moved up to the declared clip's low bound")
    clipped_above: int = Field(description="labels moved down to the declared clip's high bound")
    warnings: list[str] = Field(default_factory=list, description=(
        "for the owner who uploaded: the declared range far wider than the labels' middle 90 % (their noise "
        "would swamp them: declare a clip); nothing here is released to anyone"))


class GrantCreate(BaseModel):
    """Let ``org``'s consumer keys release from the dataset, spending at most ``epsilon`` (and ``delta``) of every
    example's budget: an allocation moved from the owner's account (sent again, it changes the allocation)."""

    model_config = REQUEST_CONFIG
    org: str = Field(min_length=1, max_length=200)
    epsilon: Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]  # 0: may read its releases, spend nothing
    delta: Delta = 0.0


class Grant(BaseModel):
    dataset_id: str
    org: str
    epsilon: float
    delta: float


class ReleaseRequest(BaseModel):
    model_config = REQUEST_CONFIG

    mechanism: MechanismName
    epsilon: Epsilon
    prior_epsilon: Epsilon | None = None
    mesh: Annotated[int, Field(ge=2, le=5000), INTEGRAL] | None = None
    solver: Solver | None = Field(default=None, description="opt-unbiased: 'continuous' (the default; outputs "
                                  "anywhere in ℝ, certified gap) or 'mesh' (the default when a mesh size is given)")
    clip: bool = False
    example_ids: list[str] | None = Field(default=None, min_length=1, fail_fast=True)
    allow_uninformative: bool = Field(default=False, description=(
        "research use: release even a mechanism whose output does not depend on the label. By default such a "
        "request is refused before anything is charged (400 uninformative_release), and a mechanism that the "
        "noisy prior makes uninformative (RRWithPrior keeping only the most likely class, RR-on-Bins with one "
        "bin) is replaced by its fallback, which the mechanism document names"))

    def identity(self) -> dict:
        """What the request says (its Idempotency-Key's body hash, the ledger's record): the opt-in only when
        given, so a request without it hashes as it did before the field existed."""
        return self.model_dump(exclude=set() if self.allow_uninformative else {"allow_uninformative"})




class EvaluationRequest(BaseModel):
    """Predictions for (test) examples; the labels party answers with a discrete-Laplace-noised mean clipped loss.
    ``metric: "mean"`` takes no predictions: the noisy mean of the examples' labels themselves (on the dataset's
    declared range, which bounds each label's contribution; ``clip`` is not used) — the constant predictor a
    trainer compares its models with."""

    model_config = REQUEST_CONFIG

    metric: Literal["mse", "poisson", "accuracy", "mean"]
    epsilon: Epsilon
    clip: float = Field(default=1e4, gt=0, le=1e15)
    example_ids: list[str] = Field(min_length=1, fail_fast=True)
    # one per example id (else 400 invalid_input); none for metric "mean"
    predictions: Omittable[list[FiniteFloat]] = Field(default=None, min_length=1, fail_fast=True)


# Releases of each kind one check may hold (its schema says so): each looks its ids up in the label version as a
# release would (a check of 48 one-id releases scanned a 2.2·10⁶-example version 48 times, 6.7 s of CPU for 2.6 KB).
MAX_CHECKED_RELEASES = 4


class PriorReleaseShape(BaseModel):
    """A per-example prior release to come (``POST .../prior-releases``: an LP-MST stage), its priors not yet known:
    its ε and the examples it would name. Checked on what its request's refusals depend on besides the priors — a
    classes dataset, ε, the ids, and the size its body decodes to with one prior over every class per example."""

    model_config = REQUEST_CONFIG

    epsilon: Epsilon
    example_ids: list[str] = Field(min_length=1, fail_fast=True)


class ReleaseChecks(BaseModel):
    """Releases a client means to ask for together — an auto job's central mean and its parts — checked as each
    would be now, before the first is asked for: nothing is drawn, charged or stored, and no Idempotency-Key taken."""

    model_config = REQUEST_CONFIG

    releases: list[ReleaseRequest] = Field(default_factory=list, max_length=MAX_CHECKED_RELEASES, fail_fast=True)
    evaluations: list[EvaluationRequest] = Field(default_factory=list, max_length=MAX_CHECKED_RELEASES,
                                                 fail_fast=True)
    prior_releases: list[PriorReleaseShape] = Field(default_factory=list, max_length=MAX_CHECKED_RELEASES,
                                                    fail_fast=True)


# What one release check asks about: a label release, an evaluation, or a prior release to come.
CheckedRelease: TypeAlias = ReleaseRequest | EvaluationRequest | PriorReleaseShape


class ReleaseCheck(BaseModel):
    """One checked release: the examples it would cover, or the refusal (code and message) its request would get."""

    num_examples: int | None = None
    error: ErrorDetail | None = None


class ReleaseChecked(BaseModel):
    """The outcome of each checked release, in the order of the request's lists."""

    releases: list[ReleaseCheck]
    evaluations: list[ReleaseCheck]
    prior_releases: list[ReleaseCheck]


MAX_QUANTILES = 100  # per quantile release


class QuantilesRequest(BaseModel):
    """DP quantiles of the dataset's labels (or of ``example_ids``' labels) on its declared domain: one exact
    exponential-mechanism draw per quantile among the domain's support, ε split evenly (basic composition)."""

    model_config = REQUEST_CONFIG

    quantiles: list[Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)]] = Field(
        min_length=1, max_length=MAX_QUANTILES, description="strictly increasing, each in (0, 1), e.g. [0.01, 0.99]")
    epsilon: Epsilon
    example_ids: list[str] | None = Field(default=None, min_length=1, fail_fast=True)
    candidates: Literal["support", "log"] = Field(default="support", description=(
        "the values drawn among: the domain's support (integers, listed values or the continuous grid), or `log`, "
        "about 200 per sign spaced geometrically from the smallest non-zero magnitude of the support to its "
        "largest, snapped to the support — for heavy-tailed labels on a wide declared range, where the support's "
        "many values in the empty tail outweigh the few near a high quantile"))

    method: Literal["exponential", "above-threshold"] = Field(default="exponential", description=(
        "`exponential`: one exponential-mechanism draw per quantile among the candidates; `above-threshold`: per "
        "quantile a sweep of the candidates from the lowest that stops at the first whose noisy count of labels at "
        "or below it reaches the noisy target rank (the sparse vector technique on monotone counts; Durfee, "
        "NeurIPS 2023) — its error is a number of ranks that the candidates beyond the answer do not add to, "
        "which makes it the one for a high quantile of heavy-tailed labels"))

    def identity(self) -> dict:
        """What the request says: ``candidates`` and ``method`` only when not their defaults, so a request without
        them hashes as it did before the fields existed."""
        return self.model_dump(exclude={name for name, default in (("candidates", "support"),
                                                                   ("method", "exponential"))
                                        if getattr(self, name) == default})


class CentralTrainingRequest(BaseModel):
    """LabelDP-Pro run at the labels party on features the features party sends (central label DP: the trust
    model where features may move but labels never do; the owner must enable it per dataset)."""

    model_config = REQUEST_CONFIG

    epsilon: Epsilon
    # The δ the noise is calibrated for; by default the organization's δ allocation on the dataset (at most it).
    # Whatever it is, the charge is the run's RDP curve, converted at the organization's δ.
    delta: Annotated[float, Field(gt=0, lt=1e-2, allow_inf_nan=False)] | None = None
    denoiser: Literal["noop", "selfspan", "selfconv", "altconv"] = "altconv"
    steps: Annotated[int, Field(ge=1, le=20_000), INTEGRAL] = 300
    batch_size: Annotated[int, Field(ge=1, le=65_536), INTEGRAL] = 128
    learning_rate: float = Field(default=0.5, gt=0, le=100)
    hidden: list[Annotated[int, Field(ge=1, le=4096), INTEGRAL]] = Field(default_factory=lambda: [64], max_length=4)
    example_ids: list[str] = Field(min_length=2, fail_fast=True)
    # one vector per example id, all of one length (else 400 invalid_input)
    features: list[Annotated[list[FiniteFloat], Field(fail_fast=True)]] = Field(min_length=2, fail_fast=True)


class PateRequest(BaseModel):
    """PATE at the labels party (``pate-fm``): teachers fitted on disjoint parts of the labelled examples the caller
    sends features for, their noisy arg-max votes (GNMax) released as one label per query (central label DP, like
    LabelDP-Pro: the owner must enable central training for the dataset)."""

    model_config = REQUEST_CONFIG

    epsilon: Epsilon
    # The δ the noise is calibrated for; by default the organization's δ allocation on the dataset (at most it).
    delta: Annotated[float, Field(gt=0, lt=1e-2, allow_inf_nan=False)] | None = None
    teachers: Annotated[int, Field(ge=2, le=1000), INTEGRAL] = 50
    steps: Annotated[int, Field(ge=1, le=5000), INTEGRAL] = 300  # each teacher's full-batch Adam steps
    learning_rate: float = Field(default=0.1, gt=0, le=100)
    example_ids: list[str] = Field(min_length=2, fail_fast=True)  # the teachers' labelled examples (charged)
    # at least one column (a teacher of no feature votes the majority: nothing to learn)
    features: list[Annotated[list[FiniteFloat], Field(min_length=1, fail_fast=True)]] = Field(min_length=2,
                                                                                                fail_fast=True)
    # the rows the student wants labels for (names of the caller's choosing) and their features: one vector each
    query_ids: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(min_length=1, fail_fast=True)
    query_features: list[Annotated[list[FiniteFloat], Field(min_length=1, fail_fast=True)]] = Field(min_length=1,
                                                                                                      fail_fast=True)


class ReleaseExecution(BaseModel):
    """Where a source release's Spark job ran, as its job recorded it when the release became available."""

    engine: Literal["spark"]
    master: str  # the SparkContext's master URL: local[...] in local mode, spark://host:port on a standalone cluster
    application_id: str  # Spark's: local-<start ms> in local mode, app-<start time>-<sequence number> on a cluster
    # executors registered besides the driver when the labels were written: 0 in local mode (the driver runs every
    # task), a cluster's executors otherwise
    executors: int
    partitions: int  # the source's input splits: one task, one derived key each
    rows: int  # written


class Release(BaseModel):
    """A release as its requester sees it: small whatever |Y| is. The mechanism's full public description (output
    values, exact probabilities, noisy prior, model parameters) is at ``GET /v1/mechanisms/{mechanism_hash}``;
    ``description`` and ``noisy_prior`` here are that document without its arrays."""

    id: str
    dataset_id: str
    mechanism: str
    epsilon: float  # as requested
    # what the ledger charged each covered example: ε rounded up to 10⁻⁹ (for δ > 0: the run's ε at the
    # organization's δ), exactly, before anything was drawn
    charged_epsilon: float
    certified_epsilon: float | None  # of the mechanism built; None until it is (running) or if it never was
    prior_epsilon: float
    randomizer_epsilon: float
    num_examples: int
    label_version: int
    created_at: datetime
    idempotency_key: str
    mechanism_hash: str | None  # None until the mechanism is built
    description: dict[str, Any]
    noisy_prior: dict[str, Any] | None = None
    # Charged when created, before anything private is drawn: "running" while it is computed (a source dataset's
    # Spark job), then "available" or "failed" — charged either way. A failed source release runs again, with the
    # same charge and the same noise, when its request is sent again with its key; any other stays failed.
    state: Literal["running", "available", "failed"] = "available"
    error: dict[str, str] | None = None
    # A source release's, once available, in GET /v1/releases/{id} for the dataset owner's admins only (a consumer's
    # application ids would tell it how many Spark applications ran for others); null otherwise.
    execution: ReleaseExecution | None = None


class AccountBudget(BaseModel):
    """One organization's allocation of every example's budget and its use (shown to the owner's admins)."""

    org: str
    epsilon_total: float  # allocated per example
    epsilon_spent: float  # the most any one example has spent of it
    epsilon_remaining: float
    delta_total: float


class Budget(BaseModel):
    """``scope`` "organization" (a consumer): the key's organization's allocation and use — nothing of other
    organizations'. "dataset" (the owner's admins): the dataset's budget, ``epsilon_spent`` summed over the
    organizations' largest per-example use (an upper bound on any example's), and every organization's account."""

    dataset_id: str
    scope: Literal["organization", "dataset"]
    epsilon_total: float
    epsilon_spent: float
    epsilon_remaining: float
    delta_total: float
    organizations: list[AccountBudget] | None = None


class AuditEvent(BaseModel):
    seq: int
    dataset_id: str
    record: dict[str, Any]
    prev_hash: str
    hash: str


class UploadEvent(BaseModel):
    """A label version as uploaded: not a privacy event (nothing leaves the labels party), listed so the audit
    shows what the declared preprocessing changed."""

    dataset_id: str
    label_version: int
    num_examples: int
    clipped_below: int
    clipped_above: int
    created_at: datetime


class Audit(BaseModel):
    events: list[AuditEvent]  # the releases' charges
    chain_valid: bool
    budgets: list[Budget]
    uploads: list[UploadEvent]
    # the chain's other entries: totals, grants, allocations, keys (with events, in seq order: the whole chain)
    facts: list[AuditEvent] = Field(default_factory=list)


class SignedHead(BaseModel):
    """A dataset's chain head, signed with the labels party's Ed25519 audit key: pin it, and later have
    ``labeldp labels verify-audit --pinned`` prove the chain still contains it (docs/design/audit.md)."""

    dataset_id: str
    seq: int
    head: str
    signed_at: str
    key_id: str
    signature: str  # hex; Ed25519 over b"labeldp audit head v1\n" + canonical JSON of the four fields above
    # set on exported transitions only (the heads log): the head before the transaction that wrote up to seq
    previous_seq: int | None = None
    previous_head: str | None = None
