"""Wire schemas of the trainer service (pydantic v2): everything a job may say is typed here, so the OpenAPI
documents every option with its range and a job that cannot run is refused before any ε is spent."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from shared import schemas

# Names of features tables and labels parties; dataset ids as the labels party issues them (letters, digits,
# '-' and '_'): never spliced into a URL unescaped, and validated before any connection is made.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$"
DATASET_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
API_KEY_PATTERN = r"^[A-Za-z0-9_-]{1,200}$"  # an API key of the labels party (ASCII only)
RELEASE_ID_PATTERN = DATASET_ID_PATTERN
SHA256_PATTERN = r"^[0-9a-f]{64}$"


class GbdtOptions(BaseModel):
    """Gradient-boosted trees (XGBoost: features_party/learn/gbdt.py), each option with its range. The defaults lean to
    noisy labels: small steps (``learning_rate``), leaves backed by many examples (``min_child_weight``), row
    subsampling, and early stopping on the job's validation split of its *privatized* labels."""

    model_config = schemas.REQUEST_CONFIG

    n_estimators: Annotated[int, Field(ge=1, le=10_000, description=(
        "the most boosting rounds (a round adds one tree, or one per class for class labels)")),
        schemas.INTEGRAL] = 500
    learning_rate: float = Field(default=0.05, gt=0, le=1, description="shrinkage of each round's trees (eta)")
    max_depth: Annotated[int, Field(ge=1, le=16), schemas.INTEGRAL] = 6
    min_child_weight: float = Field(default=10.0, ge=0, le=1e6, description=(
        "the least hessian sum of a leaf: examples for the squared loss, fewer-weighted ones for the others"))
    subsample: float = Field(default=0.8, gt=0, le=1, description="the share of rows each tree is grown on")
    colsample: float = Field(default=1.0, gt=0, le=1, description="the share of features each tree may use")
    reg_lambda: float = Field(default=1.0, ge=0, le=1e4, description="L2 penalty on leaf values")
    early_stopping_rounds: Annotated[int, Field(ge=1, le=1000, description=(
        "stop after this many rounds without a better validation loss (on the privatized validation labels) and "
        "keep the best round's model")), schemas.INTEGRAL] = 20


class TrainOptions(BaseModel):
    """Training options (features_party/learn/train.py:TrainConfig), each with its range. ``loss`` defaults to what the
    labels are: cross-entropy for classes, the subset loss for subset releases, squared for regression.
    ``model`` picks the learner: the JAX MLP/GLM (``mlp``, the default: ``hidden``, ``embed_dim``,
    ``learning_rate``, ``l2``, ``batch_size``, ``epochs``, ``patience``, ``standardize_targets``) or gradient-boosted
    trees (``gbdt``, with the options of ``gbdt``); ``loss``, ``validation_fraction`` and ``seed`` apply to both.
    A ``gbdt`` job with an MLP option other than its default, or ``gbdt`` options on an ``mlp`` job, is refused
    (``invalid_job``)."""

    model_config = schemas.REQUEST_CONFIG

    model: Literal["mlp", "gbdt", "auto"] | None = Field(default=None, description=(
        "the learner: a JAX MLP/GLM (`mlp`, the default of a fixed mechanism's job) or XGBoost trees (`gbdt`); "
        "`auto` (the default of a `release.mechanism: auto` job, and only there) lets the job choose between "
        "both on its unbiased validation labels"))
    gbdt: GbdtOptions | None = Field(default=None, description="the options of model gbdt (default: their defaults)")
    loss: Literal["squared", "poisson", "cross_entropy", "subset", "alibi"] | None = None
    hidden: list[Annotated[int, Field(ge=1, le=4096), schemas.INTEGRAL]] = Field(default_factory=lambda: [64, 32],
                                                                            max_length=8)
    embed_dim: Annotated[int, Field(ge=1, le=256), schemas.INTEGRAL] = 4
    learning_rate: float = Field(default=1e-3, gt=0, le=10)
    l2: float = Field(default=1e-4, ge=0, le=1)
    batch_size: Annotated[int, Field(ge=1, le=65536), schemas.INTEGRAL] = 1024
    epochs: Annotated[int, Field(ge=1, le=1000), schemas.INTEGRAL] = 50
    patience: Annotated[int, Field(ge=1, le=1000), schemas.INTEGRAL] = 8
    validation_fraction: float = Field(default=0.2, ge=0, le=0.9)
    seed: Annotated[int, Field(ge=0, le=2**31 - 1), schemas.INTEGRAL] = 0
    standardize_targets: bool = True


AutoCandidate = Literal["opt-unbiased", "rr-on-bins", "rp-with-prior", "rr", "rr-with-prior", "lp-2st", "alibi",
                        "block-rr"]


class AutoRelease(BaseModel):
    """``"mechanism": "auto"``: the trainer chooses the mechanism, the learner and its regularization for the data
    and ε, and returns the best of its candidates — the constant predictor always among them — by unbiased
    validation on privatized labels (features_party/auto.py). Every training example is charged ``epsilon`` once:
    the rows are split by a public rule on their ids into disjoint parts (selection, estimate, one training part per
    candidate mechanism), each released once; for numeric labels a small share of ε buys the labels' central DP mean
    (the constant) and the rest releases the labels (features_party/parts.py)."""

    model_config = schemas.REQUEST_CONFIG

    mechanism: Literal["auto"]
    epsilon: schemas.Epsilon
    example_ids: list[str] | None = Field(default=None, min_length=1, fail_fast=True)
    candidates: list[AutoCandidate] | None = Field(default=None, min_length=1, max_length=5, description=(
        "the mechanisms to choose among (default: opt-unbiased and rr-on-bins for numeric labels, rr, "
        "rr-with-prior, lp-2st and alibi for classes — alibi when the job trains the MLP: trees have no soft-label "
        "loss); rp-with-prior (numbers) and block-rr (classes) only when named: each part costs the others rows. "
        "A default candidate whose release the labels party would refuse on this dataset (a domain over its "
        "limit) is left out when the job is created, and the job's request names the ones kept; a named one is "
        "refused (400)"))
    validation: Literal["opt-unbiased", "dbrr", "rr"] | None = Field(default=None, description=(
        "the unbiased mechanism of the selection and estimate rows (default opt-unbiased for numeric labels, rr for "
        "classes). For numbers the trainer takes dbrr when the labels party would refuse opt-unbiased on this "
        "dataset (more labels than its solver takes, or the labels' share of epsilon under its floor), and fills "
        "this in when the job is created"))


class HoldoutFraction(BaseModel):
    """Hold out the rows that :func:`shared.splits.holdout_mask` holds out: the SHA-256 of ``"{seed}:{example_id}"``
    as a number in [0, 1) below ``holdout_fraction`` (a public rule: anyone with the ids and the seed draws the same
    split)."""

    model_config = schemas.REQUEST_CONFIG

    holdout_fraction: float = Field(gt=0, le=0.9, description="the expected share of rows held out")
    seed: Annotated[int, Field(ge=0, le=2**31 - 1), schemas.INTEGRAL]


class HoldoutIds(BaseModel):
    """Hold out the rows whose ids are in an id list of the caller's organization (``PUT /v1/id-lists/{name}``)."""

    model_config = schemas.REQUEST_CONFIG

    holdout_ids: str = Field(pattern=NAME_PATTERN, description="the name of an id list")
    sha256: str | None = Field(default=None, pattern=SHA256_PATTERN, description=(
        "the list's content hash; the trainer fills it in when the job is created, so every attempt holds out the "
        "same rows; give it to pin a version yourself (the list's `sha256`: the SHA-256 of the JSON array of its "
        "ids, sorted, without spaces, UTF-8). A list replaced since: 409 id_list_changed"))


class JobRequest(BaseModel):
    model_config = schemas.REQUEST_CONFIG

    features: str = Field(pattern=NAME_PATTERN, description="a features table of the caller's organization")
    labels_party: str | None = Field(default=None, pattern=NAME_PATTERN,
                                     description="a labels party configured on this trainer (default: its default)")
    dataset_id: str = Field(pattern=DATASET_ID_PATTERN)
    api_key: str = Field(pattern=API_KEY_PATTERN, description="the organization's labels-party key; used for this "
                         "job only, never stored, logged or returned", repr=False)
    release: Annotated[schemas.ReleaseRequest | AutoRelease, Field(discriminator="mechanism")] | None = Field(
        default=None, description="the release to request for this job (exactly one of release and release_id); "
        "`mechanism: auto` lets the trainer choose")
    release_id: str | None = Field(default=None, pattern=RELEASE_ID_PATTERN, description=(
        "instead of `release`: train on a release of the dataset this organization already has (a group or "
        "per-example-prior release, or one trained on before); nothing more is spent"))
    split: HoldoutFraction | HoldoutIds | None = Field(default=None, description=(
        "rows of the features table held out of training (not with `release.example_ids`): the job trains on the "
        "others, a release it requests covers only those, and its predictions mark the held-out rows "
        "(`holdout`)"))
    numeric: list[str] = Field(default_factory=list, max_length=1000, fail_fast=True)
    categorical: list[str] = Field(default_factory=list, max_length=1000, fail_fast=True)
    num_classes: Annotated[int, Field(ge=2, le=100_000), schemas.INTEGRAL] | None = None
    train: TrainOptions = Field(default_factory=TrainOptions)
    protocol: Literal["single", "lp-mst"] = "single"  # lp-mst: multi-stage RRWithPrior (classes only)
    stages: Annotated[int, Field(ge=1, le=5), schemas.INTEGRAL] = 2
    temperature: float = Field(default=1.0, gt=0, le=100)
    engine: Literal["local", "spark"] = Field(default="local", description=(
        "where the model trains: in the trainer's process (`local`), or — trees on a features table imported as "
        "Parquet files — on the trainer's Spark cluster (`spark`: XGBoost's PySpark estimator on its executors)"))
    estimate_fraction: float = Field(default=0.1, ge=0, le=0.5, description=(
        "the share of the training rows the job keeps to estimate its model's test loss and the constant "
        "predictor's (never trained on; their labels released by an unbiased mechanism, the job's own when it is "
        "one); 0: no estimate. An auto job keeps 10 % of its own"))

class ResumeRequest(BaseModel):
    model_config = schemas.REQUEST_CONFIG
    api_key: str = Field(pattern=API_KEY_PATTERN, repr=False)


class IdListView(BaseModel):
    """An id list as its organization sees it: never its ids."""

    name: str
    num_ids: int
    sha256: str = Field(description="the content hash of its ids (a job's `split.sha256`: the SHA-256 of the JSON "
                        "array of the ids, sorted, without spaces, UTF-8)")
    updated_at: datetime


class FeatureTableView(BaseModel):
    name: str
    num_examples: int
    columns: list[str]
    updated_at: datetime


class JobProgress(BaseModel):
    epoch: int
    epochs: int


class JobView(BaseModel):
    """A job as its organization sees it: compact (no example ids), never the API key."""

    id: str
    status: Literal["queued", "running", "succeeded", "failed", "interrupted"]
    protocol: str
    labels_party: str
    dataset_id: str
    progress: JobProgress
    metrics: list[dict[str, Any]] = Field(description=(
        "per epoch (model gbdt: per boosting round) `epoch`, `seconds`, and `train_loss` and `val_loss`, the "
        "training loss on the job's privatized labels (validation: the `train.validation_fraction` of the training "
        "rows) in label units, whatever scaling training used — for the squared loss ½(prediction − label)² in "
        "squared label units, with `val_mse` the mean squared error (2 × val_loss); for cross_entropy and subset "
        "nats per example; for poisson the negative log-likelihood up to a term free of the prediction. An lp-mst "
        "job: per stage, its examples, release, mean k and certified ε"))
    release: dict[str, Any] | None
    error: str | None
    error_code: str | None = Field(description="why a failed job failed, an error code: job_time_limit (stopped at "
                                   "the trainer's wall-time limit per job), no_overlap, labels_party_*, "
                                   "training_failed, …")
    num_train_examples: int
    num_holdout_examples: int = Field(description="rows of the features table the job's split held out (0 without "
                                      "a split)")
    estimate: dict[str, Any] | None = Field(default=None, description=(
        "a finished job's estimated test loss (accuracy for classes) and the constant predictor's, both with "
        "intervals, and their difference, from the job's estimate rows' privatized labels (shared/validation.py); "
        "null when it has none (estimate_fraction 0, a biased existing release)"))
    warnings: list[str] = Field(default_factory=list, description=(
        "what the user should know: the model not shown to be better than the constant predictor, no estimate"))
    auto: dict[str, Any] | None = Field(default=None, description=(
        "an auto job: its parts and ε split, every candidate's difference from the constant on the selection "
        "rows, and what it chose"))
    shrinkage: dict[str, Any] | None = Field(default=None, description=(
        "a fixed-mechanism job on numeric labels of an unbiased mechanism: the weight w of its predictions "
        "c + w·(f − m) toward the mean c of its training labels (w = 1: as trained, 0: the constant), chosen on its "
        "validation rows, with each weight's estimated loss difference from the constant "
        "(features_party/learn/shrinkage.py)"))
    seconds: float
    device: str
    created_at: datetime
    request: dict[str, Any]
