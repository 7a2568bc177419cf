"""An auto job (``release.mechanism: "auto"``): the trainer chooses the mechanism, the learner and its
regularization, and returns the best of its candidates — the constant predictor always among them — judged on
labels released by an unbiased mechanism, so that a model worse than knowing nothing is never returned silently.

1. **Releases** (:class:`features_party.parts.AutoPlan`): the training rows' disjoint parts, each released once at
   ``label_epsilon`` (selection and estimate rows by the validation mechanism, with that mechanism's training part;
   every other candidate's part by its own mechanism; LP-2ST's part in its two stages), and for numeric labels the
   central DP mean of all of them at ``mean_epsilon``: each training row is charged ε once.
2. **Candidates**: each learner (MLP, trees) at two regularizations (the job's options, and a stronger one: weight
   decay 10⁻² for the MLP; leaves of at least 200 examples and depth at most 4 for trees) on each candidate's part
   and on all parts pooled, each stopped early on the selection rows' unbiased labels (the validation loss there is
   the true loss plus a constant). Numeric predictions are then shrunk toward the constant c, c + w·(f − m) (on the
   log scale for Poisson), for w in :data:`WEIGHTS`; the constant is c itself (w = 0): the central mean, or for
   classes the class most frequent among the selection labels (estimated without bias).
3. **Choice**, post-processing of what was released: the candidate whose loss *minus the constant's* has the lowest
   upper confidence bound (mean + :data:`Z` standard errors of the paired per-example differences on the selection
   rows — small for predictions close to the constant, so noise alone does not pick a model), the constant unless
   some candidate's bound is below 0 (above 0 in accuracy for classes). Then one check on the estimate rows: a
   choice that is worse than the constant there (its difference's estimate on the wrong side of 0) gives way to the
   constant.
4. **Report**: the chosen predictor and the constant compared on the estimate rows (:func:`shared.validation.
   compare`), both with intervals, and a warning unless the model is shown to be better. The estimate rows decided
   only that one two-way check, so the interval is at level 1 − (1 − 0.95)/2, Bonferroni over the two.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from features_party.client import LabelsPartyClient
from features_party.features import Preprocessor
from features_party.gbdt import GbdtConfig, GbdtResult, threads_per_job, train_gbdt
from features_party.jobs import Attempt, finish, release_summary
from features_party.multistage import train_multistage
from features_party.output import Output
from features_party.parts import ESTIMATE, SELECTION
from features_party.planning import Config, JobPlan, load_frame
from features_party.reports import JobReport, privatized
from features_party.train import Deadline, TrainConfig, TrainResult, check_deadline, train
from shared import schemas
from shared.validation import PrivatizedLabels, compare

log = logging.getLogger("labeldp.auto")

WEIGHTS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)  # shrinkage toward the constant (0: the constant itself)
Z = 2.0  # standard errors added to a candidate's difference from the constant on the selection rows
REPORT_LEVEL = 0.975  # 1 − 0.05/2: the estimate rows decided one two-way check
VARIANTS = ("job", "strong")
POOLED = "pooled"


class Clock:
    """Seconds per phase of an auto job (its report's ``seconds``)."""

    def __init__(self) -> None:
        self.last, self.phases = time.perf_counter(), dict[str, float]()

    def lap(self, phase: str) -> dict[str, float]:
        now = time.perf_counter()
        self.phases[phase], self.last = round(now - self.last, 3), now
        return self.phases


@dataclass
class Candidate:
    """One fitted model, with its raw predictions on the selection and estimate rows and its mean raw prediction
    on the training rows (of the log rate for Poisson)."""

    training: str  # a candidate mechanism's part, or all of them pooled
    learner: str
    variant: str
    rows: int
    result: TrainResult | GbdtResult
    selection: np.ndarray
    estimate: np.ndarray
    center: float

    @property
    def name(self) -> str:
        return f"{self.training}/{self.learner}/{self.variant}"


def strong(config: Config) -> Config:
    """The stronger regularization of a learner's options."""
    if isinstance(config, GbdtConfig):
        return replace(config, min_child_weight=max(config.min_child_weight * 20, 200.0),
                       max_depth=min(config.max_depth, 4))
    return replace(config, l2=max(config.l2 * 100, 1e-2))


def run_auto(attempt: Attempt, plan: JobPlan, client: LabelsPartyClient, deadline: Deadline) -> None:
    auto, request, job_id = plan.auto, plan.request, attempt.job_id
    assert auto is not None
    clock = Clock()
    features = load_frame(plan.features_file)
    ids = plan.training_ids(features).astype(str)
    part = pd.Series(auto.parts(ids), index=ids)
    releases = {suffix: client.request_release(
        request.dataset_id, schemas.ReleaseRequest(mechanism=mechanism, epsilon=auto.label_epsilon,
                                                   example_ids=part_ids), idempotency_key=f"{job_id}-auto-{suffix}")
        for suffix, mechanism, part_ids in auto.releases(ids)}
    mean = None
    if auto.mean_epsilon > 0:
        mean = client.request_evaluation(request.dataset_id, "mean", ids, auto.mean_epsilon,
                                         idempotency_key=f"{job_id}-auto-mean")
    clock.lap("releases")
    labels = pd.Series(np.nan, index=ids)
    for release in releases.values():
        table = client.download_labels(release.id)
        labels[table.column("example_id").to_pylist()] = table.column("label").to_numpy()
    arms = [arm for arm in auto.arms if np.any(part == arm)]
    training = part.index[part.isin(arms)]
    rows = features.loc[training]
    preprocessor = Preprocessor.fit(rows, request.numeric, request.categorical)  # training rows only
    attempt.update(release_json=json.dumps(_release_summary(auto, releases, mean)),
                   num_train_examples=len(training), num_holdout_examples=len(plan.held_out),
                   epochs=len(plan.configs) * len(VARIANTS) * (len(arms) + (len(arms) > 1)))
    clock.lap("downloads")
    if "lp-2st" in arms:
        _lp_2st(plan, client, job_id, part, labels, features, preprocessor, deadline, attempt)
        clock.lap("lp-2st")
    validation = releases[auto.validation]
    selection, estimate_rows = part.index[part == SELECTION], part.index[part == ESTIMATE]
    num_classes = plan.num_classes
    noisy = privatized(client, validation, labels[selection].to_numpy(), num_classes)
    noisy_estimate = PrivatizedLabels(labels[estimate_rows].to_numpy(), noisy.mechanism, num_classes)
    constant = _constant(plan, mean, noisy)
    candidates = _fit_all(attempt, plan, features, preprocessor, part, labels, arms, selection, estimate_rows,
                          deadline)
    clock.lap("fits")
    report = JobReport()
    chosen, table = _choose(plan, candidates, noisy, constant)
    fell_back = chosen is not None and _worse_on(plan, chosen, noisy_estimate, constant)
    final = None if fell_back else chosen
    output, estimate_predictions = _output(plan, final, constant, len(estimate_rows))
    metric = "accuracy" if num_classes else ("poisson" if plan.loss == "poisson" else "mse")
    if metric == "accuracy":
        estimate_predictions = np.argmax(estimate_predictions, axis=1)
    comparison = compare(noisy_estimate, estimate_predictions, metric, constant=constant, level=REPORT_LEVEL)
    report.estimate = {**comparison.to_dict(), "release_id": validation.id, "mechanism": validation.mechanism}
    if final is None:
        why = ("the candidate chosen on the selection rows was worse than it on the estimate rows" if fell_back
               else "no candidate was shown to be better than it on the selection rows")
        report.warnings.append(f"auto chose the constant predictor ({comparison.constant_name}): {why}; the "
                               "labels at this ε carry too little signal for these features")
    elif (warning := comparison.warning()) is not None:
        report.warnings.append(warning)
    report.auto = {**auto.describe(), "constant": constant, "constant_source": _constant_source(plan, mean),
                   "candidates": [scored.to_dict() for scored in table], "fell_back": fell_back,
                   "seconds": clock.lap("choice"),
                   "chosen": {"candidate": "constant"} if final is None else {
                       "candidate": final.candidate.name, "mechanism": final.candidate.training,
                       "learner": final.candidate.learner, "regularization": final.candidate.variant,
                       "weight": final.weight}}
    model = (final or min(table, key=lambda scored: scored.upper)).candidate
    log.info("job %s: auto chose %s", job_id, report.auto["chosen"]["candidate"])
    finish(attempt, model.result, preprocessor, features, plan.held_out,
            {"mechanism": "auto", "epsilon": auto.epsilon, "chosen": report.auto["chosen"]}, report, output,
            epoch=len(model.result.history), metrics_json=json.dumps(model.result.history),
            num_train_examples=model.rows if final is not None else len(training))


def _release_summary(auto, releases: dict[str, schemas.Release], mean: schemas.Release | None) -> dict:
    """The job's ``release``: its parts' releases, the mean's, and what each example was charged in all."""
    parts = {suffix: release_summary(release) for suffix, release in releases.items()}
    labelled = max(float(r.certified_epsilon or 0.0) for r in releases.values())
    return {"mechanism": "auto", "epsilon": auto.epsilon, "parts": parts,
            "mean": release_summary(mean) if mean is not None else None,
            "certified_epsilon": labelled + (float(mean.certified_epsilon or 0.0) if mean is not None else 0.0),
            "prior_epsilon": max(float(r.prior_epsilon or 0.0) for r in releases.values())}


def _constant(plan: JobPlan, mean: schemas.Release | None, noisy: PrivatizedLabels) -> float:
    """c: the central DP mean, within the declared range (a positive rate for Poisson), or the majority class."""
    if plan.num_classes:
        return int(np.argmax(noisy.class_frequencies()))
    assert mean is not None  # numeric labels: the plan buys the mean
    description = mean.description
    value = float(np.clip(description["value"], description["range_low"], description["range_high"]))
    return max(value, 1e-6) if plan.loss == "poisson" else value


def _constant_source(plan: JobPlan, mean: schemas.Release | None) -> str:
    if mean is None:
        return "the class most frequent among the selection rows' labels (estimated without bias)"
    return (f"the central DP mean of the {mean.num_examples} training rows' labels (release {mean.id}, "
            f"ε {mean.epsilon:g}, noise scale {mean.description['noise_scale']:.3g})")


def _lp_2st(plan: JobPlan, client: LabelsPartyClient, job_id: str, part: pd.Series, labels: pd.Series,
            features: pd.DataFrame, preprocessor: Preprocessor, deadline: Deadline, attempt: Attempt) -> None:
    """LP-2ST on its part (features_party/multistage.py; its stage model the trees when the job trains them, else
    the MLP): its labels, as the stages left them, join ``labels``. Its stage keys start with the job id."""
    assert plan.auto is not None and plan.num_classes is not None
    rows = part.index[part == "lp-2st"]
    learner = "gbdt" if "gbdt" in plan.configs else "mlp"
    numeric, categorical = preprocessor.transform(features.loc[rows])
    run = train_multistage(client, plan.request.dataset_id, rows.to_numpy(), numeric, categorical,
                           vocab_sizes=preprocessor.vocab_sizes, num_classes=plan.num_classes,
                           epsilon=plan.auto.label_epsilon, stages=2, config=plan.configs[learner],
                           seed=plan.auto.seed, key_prefix=f"{job_id}-auto-", deadline=deadline,
                           threads=threads_per_job(attempt.ctx.settings.workers))
    labelled = run.labels >= 0
    labels[rows[labelled]] = run.labels[labelled]


def _fit_all(attempt: Attempt, plan: JobPlan, features: pd.DataFrame, preprocessor: Preprocessor, part: pd.Series,
             labels: pd.Series, arms: list[str], selection: pd.Index, estimate_rows: pd.Index,
             deadline: Deadline) -> list[Candidate]:
    """Every learner × regularization on every candidate's part and on all of them pooled."""
    sets = {arm: part.index[(part == arm) & labels.notna()] for arm in arms}
    if len(arms) > 1:
        sets[POOLED] = part.index[part.isin(arms) & labels.notna()]
    on_selection = preprocessor.transform(features.loc[selection])
    on_estimate = preprocessor.transform(features.loc[estimate_rows])
    threads = threads_per_job(attempt.ctx.settings.workers)
    candidates, done = [], 0
    for training, rows in sets.items():
        if len(rows) < attempt.ctx.settings.min_train_examples:
            continue
        order = rows.append(selection)
        numeric, categorical = preprocessor.transform(features.loc[order])
        targets = labels[order].to_numpy()
        if plan.num_classes:
            targets = np.rint(targets).astype(np.int32)
        validate_on = np.arange(len(order)) >= len(rows)
        for learner, config in plan.configs.items():
            for variant in VARIANTS:
                check_deadline(deadline)
                chosen = replace(strong(config) if variant == "strong" else config, validation_fraction=1.0)
                began = time.perf_counter()
                result = _fit(chosen, numeric, categorical, targets, preprocessor, plan.num_classes, validate_on,
                              deadline, threads)
                log.debug("auto fit %s/%s/%s: %.2f s, %d rounds", training, learner, variant,
                         time.perf_counter() - began, len(result.history))
                fitted = result.predict(numeric[:len(rows)], categorical[:len(rows)])
                center = float(np.mean(np.log(np.maximum(fitted, 1e-300)) if plan.loss == "poisson" else fitted)) \
                    if not plan.num_classes else 0.0
                candidates.append(Candidate(training, learner, variant, len(rows), result,
                                            result.predict(*on_selection), result.predict(*on_estimate), center))
                done += 1
                attempt.update(epoch=done)
    return candidates


def _fit(config: Config, numeric, categorical, targets, preprocessor: Preprocessor, num_classes: int | None,
         validate_on: np.ndarray, deadline: Deadline, threads: int) -> TrainResult | GbdtResult:
    if isinstance(config, GbdtConfig):
        return train_gbdt(config, numeric, categorical, targets, num_classes=num_classes, deadline=deadline,
                          threads=threads, validate_on=validate_on)
    assert isinstance(config, TrainConfig)
    return train(config, numeric, categorical, targets, vocab_sizes=preprocessor.vocab_sizes,
                 num_classes=num_classes, deadline=deadline, validate_on=validate_on)


def _shrunk(plan: JobPlan, raw: np.ndarray, center: float, weight: float, constant: float) -> np.ndarray:
    return Output("shrunk", constant, center, weight, plan.loss == "poisson").apply(raw)


def _differences(plan: JobPlan, noisy: PrivatizedLabels, predictions: np.ndarray, constant: float) -> np.ndarray:
    """Per-example unbiased terms of the candidate's loss minus the constant's (accuracy: the constant's minus the
    candidate's, so that below 0 is better for every metric)."""
    if plan.num_classes:
        fixed = noisy.correct(np.full(len(noisy), int(constant)))
        return fixed - noisy.correct(np.argmax(predictions, axis=1))
    if plan.loss == "poisson":
        return noisy.poisson(predictions) - noisy.poisson(constant)
    return noisy.squared_difference(predictions, constant)


@dataclass(frozen=True)
class Scored:
    """A candidate at one shrinkage weight, on the selection rows: its difference from the constant."""

    candidate: Candidate
    weight: float
    difference: float
    standard_error: float
    upper: float

    def to_dict(self) -> dict:
        return {"candidate": self.candidate.name, "rows": self.candidate.rows, "weight": self.weight,
                "difference": self.difference, "standard_error": self.standard_error, "upper": self.upper}


def _choose(plan: JobPlan, candidates: list[Candidate], noisy: PrivatizedLabels,
            constant: float) -> tuple[Scored | None, list[Scored]]:
    """The candidate (at its best weight) whose difference from the constant has the lowest upper bound on the
    selection rows, if below 0; else None (the constant). Also each candidate at its best weight, for the report."""
    weights = (1.0,) if plan.num_classes else WEIGHTS
    table = []
    for candidate in candidates:
        scored = []
        for weight in weights:
            predictions = candidate.selection if plan.num_classes else _shrunk(
                plan, candidate.selection, candidate.center, weight, constant)
            terms = _differences(plan, noisy, predictions, constant)
            error = float(terms.std(ddof=1) / np.sqrt(terms.size)) if terms.size > 1 else float("inf")
            scored.append(Scored(candidate, weight, float(terms.mean()), error, float(terms.mean()) + Z * error))
        table.append(min(scored, key=lambda s: s.upper))
    best = min(table, key=lambda s: s.upper, default=None)
    return (best if best is not None and best.upper < 0 else None), table


def _worse_on(plan: JobPlan, chosen: Scored, noisy: PrivatizedLabels, constant: float) -> bool:
    """The estimate rows' one check: the chosen predictor's difference from the constant estimated above 0."""
    if len(noisy) < 2:
        return False
    candidate, weight = chosen.candidate, chosen.weight
    predictions = candidate.estimate if plan.num_classes else _shrunk(plan, candidate.estimate, candidate.center,
                                                                        weight, constant)
    return float(_differences(plan, noisy, predictions, constant).mean()) > 0


def _output(plan: JobPlan, final: Scored | None, constant: float, rows: int) -> tuple[Output, np.ndarray]:
    """The saved model's output map, and the final predictor's predictions on the estimate rows."""
    if final is None:
        output = Output("constant", float(constant), num_classes=plan.num_classes)
        return output, output.apply(np.zeros((rows, 1)))
    candidate, weight = final.candidate, final.weight
    if plan.num_classes:
        return Output(), candidate.estimate
    output = Output("shrunk", float(constant), candidate.center, weight, plan.loss == "poisson")
    return output, output.apply(candidate.estimate)

