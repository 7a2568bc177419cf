"""``labeldp bench classification``: label-DP classification protocols on scikit-learn's bundled 8x8 digits,
through both parties' HTTP APIs (:mod:`labeldp.benchmarks.parties`): RR (LP-1ST), multi-stage RRWithPrior
(LP-2ST, LP-3ST) and the subset-selection randomizer with its unbiased loss as trainer-service jobs, and cluster
priors as a group release the publisher requests and a job then trains on; against a non-private model (trained
in process: no participant can train on true labels); mean ± sd over seeds."""

from __future__ import annotations

import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from features_party.client import LabelDPWarning
from features_party.learn.train import TrainConfig, train
from labeldp import references, report
from labeldp.benchmarks.parties import CONSUMER, Parties, two_parties

METHODS = ["non-private", "rr (LP-1ST)", "LP-2ST", "LP-3ST", "subset", "cluster priors"]
STAGES = {"rr (LP-1ST)": 1, "LP-2ST": 2, "LP-3ST": 3}
CLUSTERS = 10  # k-means clusters of the (public) features for the cluster-prior method
CLUSTER_PRIOR_SHARE = 0.1  # ε_p = ε/10 for the per-cluster discrete-Laplace histograms
RELEASE_SEED = 500


def train_config(epochs: int = 40) -> TrainConfig:
    """The digits model: one hidden layer of 64, cross-entropy (the bench and the demo's classification round)."""
    return TrainConfig(loss="cross_entropy", hidden=(64,), learning_rate=3e-3, l2=1e-4, batch_size=128,
                       epochs=epochs, patience=8)


def held_out(rows: int, fraction: float, seed: int, groups: np.ndarray | None = None) -> np.ndarray:
    """A bench table's test rows (a mask; ``labeldp bench utility`` and ``labeldp-pro`` draw the same): whole groups
    when the table has them (a storm's observations are alike: a test row beside its storm's training rows would
    flatter every model), else rows, by a draw seeded 10,000 + ``seed``."""
    rng = np.random.default_rng(10_000 + seed)
    if groups is not None:
        unique = pd.unique(groups)
        test = rng.choice(unique, size=int(len(unique) * fraction + 1e-9), replace=False)
        return pd.Series(groups).isin(set(test)).to_numpy()
    mask = np.zeros(rows, dtype=bool)
    mask[rng.permutation(rows)[: int(rows * fraction + 1e-9)]] = True
    return mask


@dataclass(frozen=True)
class ClassTable:
    """Numeric features and class labels by example id: scikit-learn's bundled 8x8 digits (pixels in [0, 1], labels
    0..9), or a bundled class table of ``labeldp bench utility`` (its numeric features standardized — public
    arithmetic on the features party's own columns — and its test rows drawn as that bench draws them)."""

    name: str
    x: np.ndarray
    y: np.ndarray
    ids: np.ndarray
    num_classes: int
    groups: np.ndarray | None = None
    bench_split: bool = False  # test rows by :func:`held_out` (False: digits' own fifth)
    test_fraction: float = 0.2

    @classmethod
    def digits(cls) -> ClassTable:
        from sklearn.datasets import load_digits

        digits = load_digits()
        y = digits.target.astype(np.int64)
        return cls("digits", (digits.data / 16.0).astype(np.float32), y,
                   np.array([f"d{i}" for i in range(len(y))]), 10)

    @property
    def columns(self) -> list[str]:
        return [f"x{j}" for j in range(self.x.shape[1])] if self.bench_split else [
            f"px{j}" for j in range(self.x.shape[1])]

    def features(self) -> pd.DataFrame:
        """The publisher's features table: ``example_id`` and the features."""
        return pd.DataFrame({"example_id": self.ids, **dict(zip(self.columns, self.x.T, strict=True))})

    def split(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(training rows, test rows): digits' fifth by a seeded permutation, or :func:`held_out`."""
        if self.bench_split:
            test = held_out(len(self.y), self.test_fraction, seed, self.groups)
            return np.flatnonzero(~test), np.flatnonzero(test)
        order = np.random.default_rng(500 + seed).permutation(len(self.y))
        return order[len(self.y) // 5:], order[: len(self.y) // 5]

    def accuracy(self, predicted: np.ndarray, rows: np.ndarray) -> float:
        return float(np.mean(predicted == self.y[rows]))

    def majority_accuracy(self, seed: int) -> float:
        """The mean predictor's test accuracy on ``split(seed)``: the training labels' majority class."""
        fit, test = self.split(seed)
        majority = references.constant_prediction(self.y[fit], classes=True)
        return self.accuracy(np.full(len(test), majority), test)

    def yardsticks(self, reference: pd.DataFrame) -> references.Yardsticks:
        """The references of a summary: ``reference`` has the non-private rows (``seed``, ``accuracy``)."""
        return references.Yardsticks(tuple(reference["accuracy"]),
                                     tuple(self.majority_accuracy(s) for s in reference["seed"]),
                                     higher_is_better=True)


def register_table(parties: Parties, name: str, table: ClassTable, budget: float, *,
                   central_training: bool = False, delta: float = 0.0) -> str:
    """The labels party's dataset of the table's classes, granted to the publisher (ε ``budget`` and ``delta``:
    central training's (ε, δ) runs are charged at the organization's δ, which must be allocated); its id."""
    with parties.owner() as owner:
        dataset = owner.create_dataset(name=name, label_kind="classes", num_classes=table.num_classes,
                                       epsilon_total=budget, delta_total=delta,
                                       allow_central_training=central_training)
        owner.upload_labels(dataset.id, table.ids, table.y.astype(float))
        owner.grant(dataset.id, CONSUMER, budget, delta)
    return dataset.id


def run_classification_bench(epsilons: list[float], seeds: int, out: str | Path, *, epochs: int = 40,
                             progress: bool = True) -> pd.DataFrame:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    digits = ClassTable.digits()
    config = train_config(epochs)
    rows = [non_private(digits, seed, config) for seed in range(seeds)]
    with tempfile.TemporaryDirectory(prefix="labeldp-bench-cls-") as tmp, \
            two_parties(Path(tmp), RELEASE_SEED) as parties:
        budget = (len(METHODS) - 1) * sum(epsilons)
        datasets = {s: register_table(parties, f"digits-{s}", digits, budget) for s in range(seeds)}
        with parties.trainer() as trainer:
            trainer.put_features(digits.name, digits.features())
        runs = [(seed, eps, m) for seed in range(seeds) for eps in epsilons for m in METHODS[1:]]
        for seed, epsilon, method in tqdm(runs, desc="bench classification", disable=not progress):
            run = private_run(parties, datasets[seed], digits, method, epsilon, seed, config)
            rows.append({k: v for k, v in run.items() if k != "release_ids"})
            pd.DataFrame(rows).to_csv(out / "runs.csv", index=False)
        with parties.owner() as owner:
            budgets = [owner.budget(datasets[s]) for s in range(seeds)]
            audit = owner.audit(datasets[0])
    runs = pd.DataFrame(rows)
    runs.to_csv(out / "runs.csv", index=False)
    _summary(runs, epsilons, out, budgets, audit, digits.yardsticks(runs[runs.method == "non-private"]))
    return runs


def non_private(digits: ClassTable, seed: int, config: TrainConfig) -> dict:
    """The reference model, trained in this process on the true training labels; its test accuracy."""
    fit, test = digits.split(seed)
    none = np.zeros((len(digits.y), 0), dtype=np.int32)
    model = train(config, digits.x[fit], none[fit], digits.y[fit], vocab_sizes=(), num_classes=digits.num_classes)
    predicted = np.argmax(model.predict(digits.x[test], none[test]), axis=1)
    return {"method": "non-private", "epsilon": None, "seed": seed, "accuracy": digits.accuracy(predicted, test),
            "mean_k": None}


def private_run(parties: Parties, dataset_id: str, digits: ClassTable, method: str, epsilon: float, seed: int,
                config: TrainConfig) -> dict:
    """One trainer job of ``method`` (one of ``METHODS[1:]``) on the training examples of ``digits.split(seed)``:
    its accuracy on the test examples and the ids of the releases it trained on (LP-MST: one per stage)."""
    fit, test = digits.split(seed)
    options = {**config.__dict__, "hidden": list(config.hidden), "seed": seed, "loss": None}
    fields: dict[str, Any] = {"numeric": digits.columns, "train": options}
    release = {"epsilon": epsilon, "example_ids": digits.ids[fit].tolist()}
    if method in STAGES:
        fields.update(protocol="lp-mst", stages=STAGES[method], release={**release, "mechanism": "rr"})
    elif method == "subset":
        fields.update(release={**release, "mechanism": "subset"})
    else:  # cluster priors: the publisher's group release (k-means of the features), then a job trains on it
        from sklearn.cluster import KMeans

        groups = KMeans(n_clusters=CLUSTERS, n_init=4, random_state=seed).fit_predict(digits.x[fit])
        with parties.consumer() as consumer:
            group_release = consumer.request_group_release(
                dataset_id, digits.ids[fit], groups, "rr-with-prior", epsilon, CLUSTER_PRIOR_SHARE * epsilon,
                idempotency_key=f"clusters-{seed}-{epsilon}")
        fields.update(release_id=group_release.id)
    with parties.trainer() as trainer:
        with warnings.catch_warnings():  # the bench scores every job itself
            warnings.simplefilter("ignore", LabelDPWarning)
            job = trainer.train(parties.job(digits.name, dataset_id, **fields))
        predicted = trainer.predictions(job.id).set_index("example_id")["prediction"]
    trained_on = job.release
    assert trained_on is not None  # a succeeded job trained on a release (TrainerClient.train raises otherwise)
    stages = trained_on.get("stages")
    released = [s["release_id"] for s in stages] if stages else [trained_on["id"]]
    # the job's estimate rows are released apart (features_party/parts.py): charged too, so listed with the rest
    estimate = (job.estimate or {}).get("release_id")
    return {"method": method, "epsilon": epsilon, "seed": seed,
            "mean_k": stages[-1]["mean_k"] if stages else None,
            "certified_epsilon": trained_on["certified_epsilon"],
            "accuracy": digits.accuracy(predicted[digits.ids[test]].to_numpy(), test),
            "release_ids": released + ([estimate] if estimate and estimate not in released else [])}


def _summary(runs: pd.DataFrame, epsilons: list[float], out: Path, budgets, audit,
             refs: references.Yardsticks) -> None:
    private = runs[runs.method != "non-private"]
    cells = private.groupby(["method", "epsilon"])["accuracy"]
    means = cells.mean()

    def cell(method: str, epsilon: float) -> str:
        return refs.mark(means.loc[(method, epsilon)],
                         references.mean_sd(cells.get_group((method, epsilon)), ".3f", ".3f"))

    spent = ", ".join(f"{b.epsilon_spent:g}/{b.epsilon_total:g}" for b in budgets)
    warning = refs.warning({key: float(value) for key, value in means.items()}, ".3f")
    lines = ["# Label-DP classification on scikit-learn digits (10 classes, 1438 train / 359 test)", "",
             f"Test accuracy, mean ± sd over {runs.seed.nunique()} seeds ({references.SD_RULE}).",
             *refs.lines("test accuracy", ".3f", ".3f"),
             "Every private method releases each training example's label once at ε "
             "(LP-MST: one stage per example) and trains with a trainer-service job, both parties over HTTP. "
             f"Cluster priors: k-means ({CLUSTERS} clusters) on the features, a discrete-Laplace label histogram per "
             f"cluster at ε_p = ε/{round(1 / CLUSTER_PRIOR_SHARE)}, RRWithPrior per cluster at the rest.", "",
             f"{refs.legend('.3f')}.", "",
             *report.epsilon_table(METHODS[1:], epsilons, cell, header="method"),
             *([] if warning is None else ["", warning]), "",
             f"Budget per seed's dataset (spent/total, max over examples): {spent}. Audit of seed 0: "
             f"{len(audit.events)} events, chain valid: {audit.chain_valid}."]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
