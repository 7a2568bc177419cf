"""Wire schemas shared by the labels-party service and its clients (pydantic v2).

Field names here are the public contract: a created dataset and a release have ``id``; a release has
``epsilon`` and ``certified_epsilon``; a budget has ``epsilon_total``, ``epsilon_spent``, ``epsilon_remaining``;
the audit has ``events`` and ``chain_valid``; errors are ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

LabelKind = Literal["finite", "integer", "continuous", "classes"]

# The mechanisms a release may name, by label kind (both parties check a request against these).
REGRESSION_MECHANISMS = ("opt-unbiased", "rr-on-bins", "laplace", "staircase", "dbrr", "rr")
CLASSIFICATION_MECHANISMS = ("rr", "rr-with-prior", "subset")


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


def _finite_positive(value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise ValueError("must be positive and finite")
    return value


# A budget: positive and finite; NaN and ±inf are refused.
PositiveFinite = Annotated[float, AfterValidator(_finite_positive)]
def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


# A privacy parameter a request asks for: any finite number parses; the service refuses one outside its range
# (settings.epsilon_min/max, inside what the mechanisms certify) with 400 epsilon_out_of_range, and its OpenAPI
# schema states that range.
Epsilon = Annotated[float, AfterValidator(_finite)]


class DatasetCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    label_kind: LabelKind
    values: list[float] | None = Field(default=None, max_length=100_000)
    min: float | None = None
    max: float | None = None
    num_classes: int | None = Field(default=None, ge=2, le=100_000)
    grid_size: int | None = Field(default=None, ge=2, le=10_000)
    epsilon_total: PositiveFinite
    allow_central_training: bool = False


    @model_validator(mode="after")
    def _domain_fields(self) -> DatasetCreate:
        needed = {"finite": ("values",), "integer": ("min", "max"), "continuous": ("min", "max"),
                  "classes": ("num_classes",)}[self.label_kind]
        for name in needed:
            if getattr(self, name) is None:
                raise ValueError(f"label_kind {self.label_kind!r} needs {name!r}")
        return self


class Dataset(BaseModel):
    id: str
    name: str
    label_kind: LabelKind
    domain: dict[str, Any]
    epsilon_total: float
    epsilon_spent: float
    epsilon_remaining: float
    num_examples: int
    label_version: int
    created_at: datetime


class UploadResult(BaseModel):
    dataset_id: str
    label_version: int
    num_examples: int
    new_examples: int


class GrantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    org: str = Field(min_length=1, max_length=200)


class Grant(BaseModel):
    dataset_id: str
    org: str


class ReleaseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mechanism: str
    epsilon: Epsilon
    prior_epsilon: Epsilon | None = None
    mesh: int | None = Field(default=None, ge=2, le=5000)
    exact: bool = False
    clip: bool = False
    example_ids: list[str] | None = Field(default=None, min_length=1)




class EvaluationRequest(BaseModel):
    """Predictions for (test) examples; the labels party answers with a discrete-Laplace-noised mean clipped loss."""

    model_config = ConfigDict(extra="forbid")

    metric: Literal["mse", "poisson", "accuracy"]
    epsilon: Epsilon
    clip: float = Field(default=1e4, gt=0, le=1e15)
    example_ids: list[str] = Field(min_length=1)
    predictions: list[float] = Field(min_length=1)


    @model_validator(mode="after")
    def _aligned(self) -> EvaluationRequest:
        if len(self.example_ids) != len(self.predictions):
            raise ValueError("example_ids and predictions must have the same length")
        return self


class CentralTrainingRequest(BaseModel):
    """LabelDP-Pro run at the labels party on features the features party sends (central label DP: the trust
    model where features may move but labels never do; the owner must enable it per dataset)."""

    model_config = ConfigDict(extra="forbid")

    epsilon: Epsilon
    delta: float = Field(default=1e-5, gt=0, lt=1e-2)
    denoiser: Literal["noop", "selfspan", "selfconv", "altconv"] = "altconv"
    steps: int = Field(default=300, ge=1, le=20_000)
    batch_size: int = Field(default=128, ge=1)
    learning_rate: float = Field(default=0.5, gt=0)
    hidden: list[int] = Field(default_factory=lambda: [64], max_length=4)
    example_ids: list[str] = Field(min_length=2)
    features: list[list[float]] = Field(min_length=2)


    @model_validator(mode="after")
    def _aligned(self) -> CentralTrainingRequest:
        if len(self.example_ids) != len(self.features) or len({len(f) for f in self.features}) != 1:
            raise ValueError("one feature vector of the same length per example id")
        return self


class Release(BaseModel):
    """A release as its requester sees it: small whatever |Y| is. The mechanism's full public description (output
    values, exact probabilities, noisy prior, model parameters) is at ``GET /v1/mechanisms/{mechanism_hash}``;
    ``description`` and ``noisy_prior`` here are that document without its arrays."""

    id: str
    dataset_id: str
    mechanism: str
    epsilon: float  # as requested
    charged_epsilon: float  # what the ledger charged each covered example: ε rounded up to 10⁻⁹, exactly
    certified_epsilon: float
    prior_epsilon: float
    randomizer_epsilon: float
    num_examples: int
    label_version: int
    created_at: datetime
    idempotency_key: str
    mechanism_hash: str
    description: dict[str, Any]
    noisy_prior: dict[str, Any] | None = None


class Budget(BaseModel):
    dataset_id: str
    epsilon_total: float
    epsilon_spent: float
    epsilon_remaining: float


class AuditEvent(BaseModel):
    seq: int
    dataset_id: str
    record: dict[str, Any]
    prev_hash: str
    hash: str


class Audit(BaseModel):
    events: list[AuditEvent]
    chain_valid: bool
    budgets: list[Budget]
