"""``labeldp bench labeldp-pro``: the high-privacy regime on scikit-learn digits — randomized response (LP-1ST),
RRWithPrior (LP-2ST), DP-SGD (LabelDP-Pro with the NOOP denoiser), LabelDP-Pro (ALTCONV) and PATE-FM's student
(issue 41), mean ± sd over seeds, all through the parties' HTTP APIs, against the non-private model (trained in
process on the true labels) and the majority class. RR and LP-2ST are trainer-service jobs on ε-label-DP releases;
the DP-SGD methods are central training at the labels party ((ε, δ)-label-DP with δ = 1e-6, the service's default
ceiling), whose trained parameters come back in the release's mechanism document and are applied here. PATE-FM:
:data:`PATE_TEACHERS` teachers at the labels party on the training rows but :data:`PATE_QUERIES` (a public random
choice), whose labels are never read — their noisy votes label those rows, and a trainer job (``release_id``: the
PATE release) fits the student on them: the MLP, or the trees. The paper's semi-supervised student (FixMatch on the
unlabelled rest) is not reproduced: the student learns from the voted rows alone."""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from features_party.client import LabelDPWarning
from labeldp import references, report
from labeldp.benchmarks.classification import ClassTable, non_private, register_table, train_config
from labeldp.benchmarks.parties import Parties, two_parties
from shared import models
from shared.errors import ErrorCode, LabelDPError

METHODS = ["rr (LP-1ST)", "rr-with-prior (LP-2ST)", "dp-sgd (noop)", "labeldp-pro (altconv)", "pate-fm (student)",
           "pate-fm-trees (student: trees)"]
DELTA = 1e-6
# PATE's cost grows with the queries (√Q at a given σ): few, well-voted labels. Digits: teachers of about 70 rows
# each; a bench table of ~15,000 training rows (storm-status): 200 teachers of ~75 rows, whose votes' margin (up to
# 200) can outweigh σ ≈ 110 at ε = 1 over 200 queries (δ = 10⁻⁶)
PATE_SIZES = {"digits": (20, 50)}
PATE_BENCH_TABLE = (200, 200)
TABLES = ("digits", "storm-status")
RELEASE_SEED = 600


def run_pro_bench(epsilons: list[float], seeds: int, out: str | Path, *, steps: int = 300,
                  progress: bool = True, table: str = "digits", methods: list[str] | None = None) -> pd.DataFrame:
    """``methods``: a subset of :data:`METHODS` (default all); ``table``: one of :data:`TABLES`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    digits = load_table(table)
    methods = list(methods or METHODS)
    # the references every summary shows: trained here, on the true labels (no party could)
    rows = [{**non_private(digits, seed, train_config()), "delta": None, "certified_epsilon": None}
            for seed in range(seeds)]
    with tempfile.TemporaryDirectory(prefix="labeldp-bench-pro-") as tmp, \
            two_parties(Path(tmp), RELEASE_SEED) as parties:
        datasets = {s: register_table(parties, f"{digits.name}-{s}", digits, len(methods) * sum(epsilons),
                                      central_training=True, delta=DELTA) for s in range(seeds)}
        with parties.trainer() as trainer:
            trainer.put_features(digits.name, digits.features())
        runs = [(s, e, m) for s in range(seeds) for e in epsilons for m in methods]
        for seed, epsilon, method in tqdm(runs, desc="bench labeldp-pro", disable=not progress):
            run = _central if method.startswith(("dp-sgd", "labeldp-pro")) else _pate if method.startswith(
                "pate") else _local
            predicted, certified, delta = run(parties, datasets[seed], digits, method, epsilon, seed, steps)
            rows.append({"method": method, "epsilon": epsilon, "seed": seed, "delta": delta,
                         "certified_epsilon": certified, "accuracy": digits.accuracy(predicted, digits.split(seed)[1])})
            pd.DataFrame(rows).to_csv(out / "runs.csv", index=False)
    runs = pd.DataFrame(rows)
    runs.to_csv(out / "runs.csv", index=False)
    _summary(runs, epsilons, seeds, steps, out, digits, methods, digits.yardsticks(runs[runs.method == "non-private"]))
    return runs


def load_table(name: str) -> ClassTable:
    if name == "digits":
        return ClassTable.digits()
    from labeldp.benchmarks.utility import DATASETS

    return bench_table(DATASETS[name].prepare())


def bench_table(prepared) -> ClassTable:
    """A prepared class table of ``labeldp bench utility`` (numeric features only, standardized — public arithmetic
    on the features party's own columns; its test rows drawn as that bench draws them)."""
    from labeldp.benchmarks.utility import TRUTH

    if prepared.num_classes is None or prepared.categorical:
        raise LabelDPError(f"{prepared.name}: a table of class labels and numeric features only",
                           code=ErrorCode.USAGE)
    frame = prepared.frame
    x = frame[list(prepared.numeric)].to_numpy(dtype=np.float64)
    x = ((x - x.mean(axis=0)) / np.where(x.std(axis=0) > 0, x.std(axis=0), 1.0)).astype(np.float32)
    groups = frame[prepared.group].to_numpy() if prepared.group else None
    return ClassTable(prepared.name, x, frame[TRUTH].to_numpy().astype(np.int64), frame["example_id"].to_numpy(),
                      int(prepared.num_classes), groups, True, prepared.test_fraction)


def pate_sizes(table: ClassTable) -> tuple[int, int]:
    """(teachers, queries) of PATE on ``table``."""
    return PATE_SIZES.get(table.name, PATE_BENCH_TABLE)


def _local(parties: Parties, dataset_id: str, digits: ClassTable, method: str, epsilon: float, seed: int, _steps: int):
    """LP-1ST / LP-2ST as a trainer job: the publisher trains on ε-label-DP releases."""
    fit, test = digits.split(seed)
    train = {"hidden": [64], "learning_rate": 3e-3, "batch_size": 128, "epochs": 40, "patience": 8, "seed": seed}
    job = parties.job(digits.name, dataset_id, protocol="lp-mst", stages=1 if "LP-1ST" in method else 2,
                      release={"mechanism": "rr", "epsilon": epsilon, "example_ids": digits.ids[fit].tolist()},
                      numeric=digits.columns, train=train)
    with parties.trainer() as trainer:
        with warnings.catch_warnings():  # the bench scores every job itself
            warnings.simplefilter("ignore", LabelDPWarning)
            done = trainer.train(job)
        predicted = trainer.predictions(done.id).set_index("example_id")["prediction"]
    assert done.release is not None  # a succeeded job trained on a release (TrainerClient.train raises otherwise)
    return predicted[digits.ids[test]].to_numpy(), done.release["certified_epsilon"], 0.0


def _pate(parties: Parties, dataset_id: str, digits: ClassTable, method: str, epsilon: float, seed: int, _steps: int):
    """PATE-FM: the labels party's teachers vote (GNMax) on the query rows; a trainer job fits the student on them —
    the MLP, or the trees (``pate-fm-trees``: the same release, its Idempotency-Key the same, charged once)."""
    fit, test = digits.split(seed)
    teachers_count, queries_count = pate_sizes(digits)
    queries = np.random.default_rng(seed).permutation(fit)[:queries_count]
    teachers = np.setdiff1d(fit, queries)
    with parties.consumer() as consumer:
        release = consumer.request_pate(dataset_id, digits.ids[teachers], digits.x[teachers], digits.ids[queries],
                                        digits.x[queries], epsilon, delta=DELTA, teachers=teachers_count,
                                        idempotency_key=f"pate-{epsilon}-{seed}")
    train = {"hidden": [64], "learning_rate": 3e-3, "batch_size": 16, "epochs": 60, "patience": 60,
             "validation_fraction": 0.0, "seed": seed}
    if "trees" in method:  # stops early on a fifth of the voted rows
        train = {"model": "gbdt", "validation_fraction": 0.2, "seed": seed}
    job = parties.job(digits.name, dataset_id, release_id=release.id, numeric=digits.columns, train=train)
    with parties.trainer() as trainer:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LabelDPWarning)
            done = trainer.train(job)
        predicted = trainer.predictions(done.id).set_index("example_id")["prediction"]
    return predicted[digits.ids[test]].to_numpy(), release.certified_epsilon, DELTA


def _central(parties: Parties, dataset_id: str, digits: ClassTable, method: str, epsilon: float, seed: int, steps: int):
    """DP-SGD / LabelDP-Pro at the labels party: the publisher sends features and gets parameters back."""
    fit, test = digits.split(seed)
    with parties.consumer() as consumer:
        release = consumer.request_central_training(
            dataset_id, digits.ids[fit], digits.x[fit], epsilon, denoiser="noop" if "noop" in method else "altconv",
            delta=DELTA, steps=steps, batch_size=256, learning_rate=0.5,
            idempotency_key=f"{method}-{epsilon}-{seed}")
        assert release.mechanism_hash is not None  # an available release: its mechanism was built
        document = consumer.mechanism_document(release.mechanism_hash)
    params = models.params_from_lists(document["description"]["parameters"])
    logits = models.apply(params, digits.x[test], jnp.zeros((len(test), 0), jnp.int32))
    return np.argmax(np.asarray(logits), axis=1), release.certified_epsilon, DELTA


def _summary(runs: pd.DataFrame, epsilons: list[float], seeds: int, steps: int, out: Path, table: ClassTable,
             methods: list[str], refs: references.Yardsticks) -> None:
    cells = runs[runs.method != "non-private"].groupby(["method", "epsilon"])["accuracy"]
    means = cells.mean()
    warning = refs.warning({key: float(value) for key, value in means.items()}, ".3f")
    fit, test = table.split(0)
    teachers, queries = pate_sizes(table)
    title = "scikit-learn digits" if table.name == "digits" else f"{table.name} ({table.num_classes} classes)"
    lines = [f"# High-privacy regime on {title} ({len(fit)} train / {len(test)} test, seed 0's split)", "",
             f"Test accuracy, mean ± sd over {seeds} seeds ({references.SD_RULE}). RR / LP-2ST: ε-label-DP releases "
             "and trainer jobs; DP-SGD and LabelDP-Pro: central (ε, δ = 1e-6)-label-DP training at the labels party, "
             f"σ calibrated with dp-accounting (RDP, Poisson sampling q = 256/{len(fit)}, {steps} steps); PATE-FM: "
             f"{teachers} teachers vote on {queries} query rows (GNMax, (ε, δ = 1e-6) by dp-accounting's RDP), the "
             "student a trainer job on them; both parties over HTTP.",
             *refs.lines("test accuracy", ".3f", ".3f"), "", f"{refs.legend('.3f')}.", "",
             *report.epsilon_table(methods, epsilons, lambda m, e: refs.mark(
                 means.loc[(m, e)], references.mean_sd(cells.get_group((m, e)), ".3f", ".3f")), header="method"),
             *([] if warning is None else ["", warning])]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
