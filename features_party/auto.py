"""An auto job (``release.mechanism: "auto"``): the trainer chooses the mechanism, the learner and its
regularization, and returns the best of its candidates — the constant predictor always among them — judged on
labels released by an unbiased mechanism, so that a model worse than knowing nothing is never returned silently.

1. **Releases** (:class:`features_party.parts.AutoPlan`): the training rows' disjoint parts, each released once at
   ``label_epsilon`` (selection and estimate rows by the validation mechanism, with that mechanism's training part;
   every other candidate's part by its own mechanism; LP-2ST's part in its two stages), and for numeric labels the
   central DP mean of all of them at ``mean_epsilon``: each training row is charged ε once.
2. **Candidates**: each learner (MLP, trees) at two regularizations (the job's options, and a stronger one: weight
   decay 10⁻² for the MLP; leaves of at least 200 examples and depth at most 4 for trees) on each candidate's part
   and on all parts pooled (:func:`designs`; for classes ALIBI's part also pooled with K-ary RR's, each row's target
   its likelihood of every class under its own mechanism), each stopped early on a validation split of its own
   training rows' labels (``train.validation_fraction``) — never on the rows that judge it: a model picked among its
   epochs to fit their noise looks better on them than it is (a tree so stopped on the selection rows was chosen at ε
   = 0.25 and was 11 % worse than the constant). **Judged on a large unbiased sample:** the validation mechanism's
   part (opt-unbiased, or K-ary RR for classes) has unbiased labels too, so it is split in two folds by a public hash
   — its candidates (and the pooled ones) are fitted on one fold and judged on the other, then the chosen one is
   refitted on both — and every other candidate is judged on all of it: each candidate is judged on the selection
   rows and about half of the training rows, not the selection rows alone (at ε = 0.5 on 17,800 rows those could not
   tell a 20 % gain from noise). Numeric predictions are then shrunk toward the constant c, c + w·(f − m) (on the log
   scale for Poisson), for w in :data:`WEIGHTS`, m their mean on the judging rows; the constant is c itself (w = 0):
   the central mean, or for classes the majority class of the RRWithPrior part's noisy histogram (a central DP
   count).
3. **Choice**, post-processing of what was released: a candidate is eligible when its loss *minus the constant's*
   has an upper confidence bound below 0: mean + z standard errors of the paired per-example differences on its
   judging rows (small for predictions close to the constant), z Bonferroni's over every candidate at every weight
   (:func:`shared.validation.eligibility_z`, 3.3 for 96), so that any one no better than the constant is eligible
   with probability at most 5 % in all; in accuracy for classes, the same on the error. Among the eligible the
   least mean + :data:`Z_CHOICE` standard errors is chosen (the least bound itself would prefer a safe small gain
   to a sure large one); none eligible: the constant. Then one check on the estimate rows: a choice that is worse
   than the constant there (its difference's estimate on the wrong side of 0) gives way to the constant.
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

from features_party.attempt import Attempt, finish, release_summary
from features_party.client import LabelsPartyClient
from features_party.features import Preprocessor
from features_party.learn.gbdt import GbdtConfig, GbdtResult, threads_per_job, train_gbdt
from features_party.learn.output import Output
from features_party.learn.targets import training_targets
from features_party.learn.train import Deadline, TrainConfig, TrainResult, check_deadline, train
from features_party.multistage import train_multistage
from features_party.parts import ESTIMATE, SELECTION, SOFT_ARMS
from features_party.planning import Config, JobPlan, load_frame
from features_party.reports import JobReport, privatized
from shared import schemas
from shared.errors import ErrorCode, LabelDPError
from shared.mechanisms.randomized_response import RandomizedResponse
from shared.validation import PrivatizedLabels, compare, eligibility_z

log = logging.getLogger("labeldp.auto")

WEIGHTS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)  # shrinkage toward the constant (0: the constant itself)
Z_CHOICE = 0.5  # among the eligible, the least difference + Z_CHOICE standard errors is chosen
REPORT_LEVEL = 0.975  # 1 − 0.05/2: the estimate rows decided one two-way check
VARIANTS = ("job", "strong")
POOLED = "pooled"
SOFT_POOLED = "pooled-alibi"  # ALIBI's part with the validation mechanism's (K-ary RR), both as likelihoods


class Clock:
    """Seconds per phase of an auto job (its report's ``seconds``)."""

    def __init__(self) -> None:
        self.last, self.phases = time.perf_counter(), dict[str, float]()

    def lap(self, phase: str) -> dict[str, float]:
        now = time.perf_counter()
        self.phases[phase], self.last = round(now - self.last, 3), now
        return self.phases


@dataclass(frozen=True)
class Design:
    """How one training set's candidates are fitted and judged: each fit trains on ``train`` and is judged on its
    out-of-fold rows ``judged`` (unbiased labels it never saw) and on the selection rows; ``refit`` (None: the one
    fit is final) the rows a chosen candidate is fitted on again, whole, when its fits were folds."""

    training: str  # a candidate mechanism's part, or all of them pooled
    fits: tuple[tuple[pd.Index, pd.Index], ...]
    refit: pd.Index | None

    @property
    def rows(self) -> int:
        return len(self.refit if self.refit is not None else self.fits[0][0])


@dataclass
class Candidate:
    """One learner at one regularization on one design: its predictions on the judging pool (the selection rows,
    averaged over its fits, then every fit's out-of-fold rows) and, for a single fit, the model itself."""

    design: Design
    learner: str
    variant: str
    config: Config
    pool: np.ndarray  # raw predictions on the pool's rows, in the pool's order
    center: float  # their mean (of the log rate for Poisson): the shrinkage's m
    model: TrainResult | GbdtResult  # its last fit (final unless the design refits the chosen whole)
    best_epochs: tuple[int, ...] = ()  # each fit's kept epoch (boosting round): how long the refit trains

    @property
    def name(self) -> str:
        return f"{self.design.training}/{self.learner}/{self.variant}"


def strong(config: Config) -> Config:
    """The stronger regularization of a learner's options."""
    if isinstance(config, GbdtConfig):  # within the options' ranges, which a saved model is checked against
        return replace(config, min_child_weight=min(max(config.min_child_weight * 20, 200.0), 1e6),
                       max_depth=min(config.max_depth, 4))
    return replace(config, l2=min(max(config.l2 * 100, 1e-2), 1.0))


def designs(part: pd.Series, labelled: pd.Series, arms: list[str], folds: pd.Series,
            unbiased_arm: str | None) -> tuple[list[Design], pd.Index]:
    """The designs and the judging pool's out-of-fold rows. The training part of the validation mechanism
    (opt-unbiased, or K-ary RR for classes: its labels are unbiased too) is split in two folds by a public hash: its
    candidates (and the pooled ones) are fitted on one fold and judged on the other, then refitted whole once
    chosen; every other candidate is judged on all of it. Each candidate is thus judged on the selection rows and on
    about half of the training rows — a far larger sample of unbiased labels than the selection rows alone (issue
    39: at ε = 0.5 on 17,800 rows those could not tell a 20 % gain from noise). ``labelled``: the rows with a
    target. The parts of :data:`~features_party.parts.SOFT_ARMS` (per-class likelihoods) are not pooled with labels,
    but with K-ary RR's as likelihoods (:data:`SOFT_POOLED`): ALIBI's part alone is a fifth of the training rows,
    and ALIBI's MLP on every row had half the error of auto's choice on storm-status at ε = 0.5 and 1
    (docs/results/auto)."""
    sets = {arm: part.index[(part == arm) & labelled] for arm in arms}
    if unbiased_arm is None or unbiased_arm not in sets:
        out = [Design(arm, ((rows, rows[:0]),), None) for arm, rows in sets.items()]
        hard = [arm for arm in arms if arm not in SOFT_ARMS]
        if len(hard) > 1:
            pooled = part.index[part.isin(hard) & labelled]
            out.append(Design(POOLED, ((pooled, pooled[:0]),), None))
        return out, part.index[:0]
    unbiased = sets[unbiased_arm]
    first, second = unbiased[folds[unbiased].to_numpy()], unbiased[~folds[unbiased].to_numpy()]
    out = [Design(unbiased_arm, ((first, second), (second, first)), unbiased)]
    others = [rows for arm, rows in sets.items() if arm != unbiased_arm and arm not in SOFT_ARMS]
    out += [Design(arm, ((rows, unbiased),), None) for arm, rows in sets.items() if arm != unbiased_arm]
    if others:
        rest = others[0].append(others[1:]) if len(others) > 1 else others[0]
        out.append(Design(POOLED, ((rest.append(first), second), (rest.append(second), first)),
                          rest.append(unbiased)))
    for arm in SOFT_ARMS:
        if arm in sets:
            soft = sets[arm]
            out.append(Design(SOFT_POOLED, ((soft.append(first), second), (soft.append(second), first)),
                              soft.append(unbiased)))
    return out, unbiased


def run_auto(attempt: Attempt, plan: JobPlan, client: LabelsPartyClient, deadline: Deadline) -> None:
    auto, request, job_id = plan.auto, plan.request, attempt.job_id
    assert auto is not None
    clock = Clock()
    features = load_frame(plan.features_file, plan.columns)
    ids = plan.training_ids(features).astype(str)
    part = pd.Series(auto.parts(ids), index=ids)
    mean, releases = request_auto_releases(plan, client, job_id, ids)  # the ones creation asked for, again
    clock.lap("releases")
    labels = pd.Series(np.nan, index=ids)
    soft = pd.DataFrame(index=ids[:0], dtype=np.float64)  # ALIBI's rows: per-class log-likelihoods
    for release in releases.values():
        table = client.download_labels(release.id)
        released = table.column("example_id").to_pylist()
        if release.mechanism in SOFT_ARMS:
            soft = pd.DataFrame(training_targets(table, release), index=pd.Index(released, dtype=object))
        else:
            labels[released] = table.column("label").to_numpy()
    targets = Targets(labels, soft)
    arms = [arm for arm in auto.arms if np.any(part == arm)]
    training = part.index[part.isin(arms)]
    preprocessor = Preprocessor.fit(features.loc[training], request.numeric, request.categorical)  # training rows
    attempt.update(release_json=json.dumps(_release_summary(auto, releases, mean)),
                   num_train_examples=len(training), num_holdout_examples=len(plan.held_out))
    clock.lap("downloads")
    if "lp-2st" in arms:
        _lp_2st(plan, client, job_id, part, labels, features, preprocessor, deadline, attempt)
        clock.lap("lp-2st")
    num_classes = plan.num_classes
    selection, estimate_rows = part.index[part == SELECTION], part.index[part == ESTIMATE]
    # the validation mechanism's training part (opt-unbiased, or K-ary RR) is unbiased too, and judges out of fold
    plans, out_of_fold = designs(part, targets.labelled(), arms, auto.folds(ids), auto.validation)
    pool = selection.append(out_of_fold)
    validation = releases[auto.validation]
    judged = privatized(client, validation, labels[pool].to_numpy(), num_classes)
    noisy_estimate = PrivatizedLabels(labels[estimate_rows].to_numpy(), judged.mechanism, num_classes)
    constant_of = _constant(plan, client, mean, releases, judged.subset(np.arange(len(pool)) < len(selection)))
    constant = constant_of.value
    targets = _with_rr_likelihoods(targets, judged) if num_classes else targets
    candidates = _fit_all(attempt, plan, features, preprocessor, targets, plans, selection, out_of_fold, deadline)
    clock.lap("fits")
    chosen, table = _choose(plan, candidates, judged, constant)
    final = None
    if chosen is not None:
        final = _final(attempt, plan, features, preprocessor, targets, chosen, pool, constant, deadline)
    fell_back = final is not None and _worse_on(plan, final, features.loc[estimate_rows], preprocessor,
                                                  noisy_estimate, constant)
    if fell_back:
        final = None
    clock.lap("final")
    report = _report(plan, auto, final, chosen, table, fell_back, constant_of, features.loc[estimate_rows],
                     preprocessor, noisy_estimate, validation)
    report.auto = {**(report.auto or {}), "seconds": clock.lap("report")}
    model, output = final if final is not None else (_any_model(candidates), _constant_output(plan, constant))
    log.info("job %s: auto chose %s", job_id, report.auto["chosen"]["candidate"])
    trained_on = chosen.candidate.design.rows if final is not None and chosen is not None else len(training)
    finish(attempt, model, preprocessor, features, plan.held_out,
           {"mechanism": "auto", "epsilon": auto.epsilon, "chosen": report.auto["chosen"]}, report, output,
           epoch=len(model.history), metrics_json=json.dumps(model.history), num_train_examples=trained_on)


def request_auto_releases(plan: JobPlan, client: LabelsPartyClient, job_id: str, ids: pd.Index,
                          answered: list | None = None) -> tuple[schemas.Release | None, dict[str, schemas.Release]]:
    """An auto job's releases, each under an Idempotency-Key made of the job id (a retry gets back what the first
    request was charged for): the labels' central mean first — it names every training id and has the smallest ε,
    so what the labels party refuses (an unknown id, ε under its floor, a body over its limit) is refused before
    anything is charged — then each part. Asked for when the job is created, and again by every attempt.
    ``answered``: each release is appended as it comes (what was charged, should a later one be refused)."""
    auto = plan.auto
    assert auto is not None
    answered = [] if answered is None else answered
    mean = None
    if auto.mean_epsilon > 0:
        mean = client.request_evaluation(plan.request.dataset_id, "mean", ids, auto.mean_epsilon,
                                         idempotency_key=f"{job_id}-auto-mean")
        answered.append(mean)
    releases = {}
    for suffix, mechanism, part_ids in auto.releases(ids):
        releases[suffix] = client.request_release(
            plan.request.dataset_id, schemas.ReleaseRequest(mechanism=mechanism, epsilon=auto.label_epsilon,
                                                            example_ids=part_ids),
            idempotency_key=f"{job_id}-auto-{suffix}")
        answered.append(releases[suffix])
    return mean, releases


def _release_summary(auto, releases: dict[str, schemas.Release], mean: schemas.Release | None) -> dict:
    """The job's ``release``: its parts' releases, the mean's, and what each example was charged in all."""
    parts = {suffix: release_summary(release) for suffix, release in releases.items()}
    labelled = max(float(r.certified_epsilon or 0.0) for r in releases.values())
    return {"mechanism": "auto", "epsilon": auto.epsilon, "parts": parts,
            "mean": release_summary(mean) if mean is not None else None,
            "certified_epsilon": labelled + (float(mean.certified_epsilon or 0.0) if mean is not None else 0.0),
            "prior_epsilon": max(float(r.prior_epsilon or 0.0) for r in releases.values())}


@dataclass(frozen=True)
class Constant:
    """The constant predictor c and where it came from (post-processing of released quantities only)."""

    value: float
    source: str


def _constant(plan: JobPlan, client: LabelsPartyClient, mean: schemas.Release | None,
              releases: dict[str, schemas.Release], noisy: PrivatizedLabels) -> Constant:
    """c: the central DP mean, within the declared range (a positive rate for Poisson); for classes the majority
    class of the RRWithPrior part's noisy histogram (a central DP count of thousands of labels, discrete-Laplace noise
    of scale 2/ε_prior), else — no such part among the candidates — the argmax of the selection rows' unbiased
    K-ary-RR frequencies (at ε = 0.25 and K = 7 the true class is reported with probability 0.18 against 0.14 for
    each other: those frequencies picked a wrong class in 3 of 3 seeds on storm-status)."""
    if plan.num_classes:
        prior = releases.get("rr-with-prior")
        if prior is not None and prior.mechanism_hash:
            counts = (client.mechanism_document(prior.mechanism_hash).get("noisy_prior") or {}).get("noisy_counts")
            if counts is not None and len(counts) == plan.num_classes:
                return Constant(int(np.argmax(counts)), (
                    f"the class most frequent in the noisy histogram of the {prior.num_examples} rr-with-prior "
                    f"rows' labels (release {prior.id}, prior ε {prior.prior_epsilon or 0:g})"))
        return Constant(int(np.argmax(noisy.class_frequencies())),
                        "the class most frequent among the selection rows' labels (estimated without bias)")
    assert mean is not None  # numeric labels: the plan buys the mean
    description = mean.description
    value = float(np.clip(description["value"], description["range_low"], description["range_high"]))
    return Constant(max(value, 1e-6) if plan.loss == "poisson" else value, (
        f"the central DP mean of the {mean.num_examples} training rows' labels (release {mean.id}, "
        f"ε {mean.epsilon:g}, noise scale {mean.description['noise_scale']:.3g})"))


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


def _fit_all(attempt: Attempt, plan: JobPlan, features: pd.DataFrame, preprocessor: Preprocessor,
             targets: Targets, plans: list[Design], selection: pd.Index, out_of_fold: pd.Index,
             deadline: Deadline) -> list[Candidate]:
    """Every learner × regularization on every design: its predictions on the pool (the selection rows, averaged
    over the design's fits, then each out-of-fold row from the fit that did not see it). A soft arm's design (ALIBI)
    trains the MLP only, with its own loss."""
    threads = threads_per_job(attempt.ctx.settings.workers)
    on_selection = preprocessor.transform(features.loc[selection])
    position = pd.Series(np.arange(len(out_of_fold)), index=out_of_fold)
    candidates, done = [], 0
    attempt.update(epochs=len(plan.configs) * len(VARIANTS) * sum(len(d.fits) for d in plans))
    for design in plans:
        if any(len(train_rows) < attempt.ctx.settings.min_train_examples for train_rows, _ in design.fits):
            continue
        for learner, base in plan.configs.items():
            if (loss := soft_loss(design.training)) is not None:
                if not isinstance(base, TrainConfig):  # a tree has no soft-label loss
                    continue
                base = replace(base, loss=loss)
            for variant in VARIANTS:
                config = strong(base) if variant == "strong" else base
                on_pool = np.zeros((len(selection) + len(out_of_fold), *([plan.num_classes] if plan.num_classes
                                                                           else [])))
                model: TrainResult | GbdtResult | None = None
                kept = []
                for train_rows, judged in design.fits:
                    check_deadline(deadline)
                    model = _fit(config, features, preprocessor, targets, train_rows, design, plan.num_classes,
                                 deadline, threads)
                    on_pool[:len(selection)] += model.predict(*on_selection) / len(design.fits)
                    if len(judged):
                        on_pool[len(selection) + position[judged].to_numpy()] = model.predict(
                            *preprocessor.transform(features.loc[judged]))
                    kept.append(model.best_epoch)
                    done += 1
                    attempt.update(epoch=done)
                assert model is not None  # a design has at least one fit
                candidates.append(Candidate(design, learner, variant, config, on_pool, _center(plan, on_pool),
                                            model, tuple(kept)))
    return candidates


def _center(plan: JobPlan, raw: np.ndarray) -> float:
    if plan.num_classes:
        return 0.0
    return float(np.mean(np.log(np.maximum(raw, 1e-300)) if plan.loss == "poisson" else raw))


def soft_loss(training: str) -> str | None:
    """The loss of a design that trains on per-class likelihoods (ALIBI's, alone or pooled), else None."""
    return "alibi" if training in SOFT_ARMS or training == SOFT_POOLED else None


@dataclass(frozen=True)
class Targets:
    """What the candidates fit, by example id: the released labels, ALIBI's per-class log-likelihoods for its
    part's rows (none elsewhere), and K-ary RR's (log p, log q): the log-likelihood of its released class given each
    true one, log p for the class released and log q for every other (None: no RR release)."""

    labels: pd.Series
    soft: pd.DataFrame
    rr_log_likelihoods: tuple[float, float] | None = None

    def labelled(self) -> pd.Series:
        return self.labels.notna() | self.labels.index.isin(self.soft.index)

    def of(self, rows: pd.Index, training: str, num_classes: int | None) -> np.ndarray:
        """The targets of ``rows`` of the design that trains on ``training`` (a part, or the parts pooled): per-class
        log-likelihoods for a soft design (its RR rows' from their released class), else labels."""
        if soft_loss(training) is not None:
            assert num_classes is not None
            out = np.empty((len(rows), num_classes), dtype=np.float32)
            soft = rows.isin(self.soft.index)
            out[soft] = self.soft.loc[rows[soft]].to_numpy(dtype=np.float32)
            if not soft.all():
                assert self.rr_log_likelihoods is not None  # SOFT_POOLED is designed only beside an RR part
                keep, other = self.rr_log_likelihoods
                released = np.rint(self.labels[rows[~soft]].to_numpy()).astype(np.int64)
                hard = np.full((released.size, num_classes), other, dtype=np.float32)
                hard[np.arange(released.size), released] = keep
                out[~soft] = hard
            return out
        out = self.labels[rows].to_numpy()
        return np.rint(out).astype(np.int32) if num_classes else out


def _with_rr_likelihoods(targets: Targets, noisy: PrivatizedLabels) -> Targets:
    """``targets`` with K-ary RR's likelihoods (the validation release's), for ALIBI's part pooled with RR's."""
    rr = noisy.mechanism
    assert isinstance(rr, RandomizedResponse)
    return replace(targets, rr_log_likelihoods=(float(np.log(rr.keep_probability)),
                                                float(np.log(rr.other_probability))))


def _fit(config: Config, features: pd.DataFrame, preprocessor: Preprocessor, targets: Targets, rows: pd.Index,
         design: Design, num_classes: int | None, deadline: Deadline, threads: int) -> TrainResult | GbdtResult:
    """A model on ``rows`` of ``design``, stopped early on a validation split of their own labels — never on the
    rows that judge it, whose labels would then judge a model chosen to fit their noise."""
    numeric, categorical = preprocessor.transform(features.loc[rows])
    fitted = targets.of(rows, design.training, num_classes)
    if isinstance(config, GbdtConfig):
        return train_gbdt(config, numeric, categorical, fitted, num_classes=num_classes, deadline=deadline,
                          threads=threads)
    assert isinstance(config, TrainConfig)
    return train(config, numeric, categorical, fitted, vocab_sizes=preprocessor.vocab_sizes,
                 num_classes=num_classes, deadline=deadline)


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
    """A candidate at one shrinkage weight, judged on its pool: its difference from the constant."""

    candidate: Candidate
    weight: float
    difference: float
    standard_error: float
    z: float  # the job's eligibility bound, in standard errors

    @property
    def upper(self) -> float:
        """The bound a candidate must have below 0 to be chosen over the constant."""
        return self.difference + self.z * self.standard_error

    @property
    def score(self) -> float:
        """What the chosen one has the least of, among those eligible."""
        return self.difference + Z_CHOICE * self.standard_error

    def to_dict(self) -> dict:
        return {"candidate": self.candidate.name, "rows": self.candidate.design.rows,
                "fits": len(self.candidate.design.fits), "judged_on": int(len(self.candidate.pool)),
                "weight": self.weight, "difference": self.difference, "standard_error": self.standard_error,
                "upper": self.upper, "z": self.z, "eligible": self.upper < 0}


def _choose(plan: JobPlan, candidates: list[Candidate], noisy: PrivatizedLabels,
            constant: float) -> tuple[Scored | None, list[Scored]]:
    """Among the candidates (each at each shrinkage weight) whose difference from the constant on their pool has an
    upper bound below 0, the one with the least :attr:`Scored.score`; None (the constant) when none has. Also each
    candidate at its best weight, for the report."""
    weights = (1.0,) if plan.num_classes else WEIGHTS
    z = eligibility_z(len(candidates) * len(weights))
    table = []
    for candidate in candidates:
        scored = []
        for weight in weights:
            predictions = candidate.pool if plan.num_classes else _shrunk(
                plan, candidate.pool, candidate.center, weight, constant)
            terms = _differences(plan, noisy, predictions, constant)
            error = float(terms.std(ddof=1) / np.sqrt(terms.size)) if terms.size > 1 else float("inf")
            scored.append(Scored(candidate, weight, float(terms.mean()), error, z))
        eligible = [s for s in scored if s.upper < 0]
        table.append(min(eligible or scored, key=lambda s: s.score if eligible else s.upper))
    best = min((s for s in table if s.upper < 0), key=lambda s: s.score, default=None)
    return best, table


Final = tuple[TrainResult | GbdtResult, Output]


def _final(attempt: Attempt, plan: JobPlan, features: pd.DataFrame, preprocessor: Preprocessor, targets: Targets,
           chosen: Scored, pool: pd.Index, constant: float, deadline: Deadline) -> Final:
    """The chosen candidate as a model and its output map: its one fit, or — when it was judged by folds — fitted
    again on both folds (more rows than either fold's model: at least as good in expectation, and checked on the
    estimate rows); shrunk by its weight around its mean prediction on the pool."""
    candidate = chosen.candidate
    model = candidate.model
    if candidate.design.refit is not None:
        model = _fit(refit_config(candidate.config, candidate.best_epochs), features, preprocessor, targets,
                     candidate.design.refit, candidate.design, plan.num_classes, deadline,
                     threads_per_job(attempt.ctx.settings.workers))
    if plan.num_classes:
        return model, Output()
    center = _center(plan, model.predict(*preprocessor.transform(features.loc[pool])))
    return model, Output("shrunk", float(constant), center, chosen.weight, plan.loss == "poisson")


def refit_config(config: Config, best_epochs: tuple[int, ...]) -> Config:
    """The options of a refit on both folds: the same learner, trained for as many epochs (boosting rounds) as its
    fold models kept on average, on every row — no early stopping on its own noisy labels, which could stop it
    anywhere and leave it unlike the fold models that were judged."""
    epochs = max(1, round(float(np.mean(best_epochs))))
    if isinstance(config, GbdtConfig):  # (early stopping is off: no validation rows; its rounds within the schema's)
        return replace(config, n_estimators=epochs, early_stopping_rounds=min(epochs, 1000), validation_fraction=0.0)
    return replace(config, epochs=epochs, patience=epochs, validation_fraction=0.0)


def _predictions(plan: JobPlan, final: Final, rows: pd.DataFrame, preprocessor: Preprocessor) -> np.ndarray:
    model, output = final
    return output.apply(model.predict(*preprocessor.transform(rows)))


def _worse_on(plan: JobPlan, final: Final, rows: pd.DataFrame, preprocessor: Preprocessor,
              noisy: PrivatizedLabels, constant: float) -> bool:
    """The estimate rows' one check: the final predictor's difference from the constant estimated above 0."""
    if len(noisy) < 2:
        return False
    predictions = _predictions(plan, final, rows, preprocessor)
    if not np.all(np.isfinite(predictions)):  # a diverged model: the constant
        return True
    return not float(_differences(plan, noisy, predictions, constant).mean()) <= 0


def _constant_output(plan: JobPlan, constant: float) -> Output:
    return Output("constant", float(constant), num_classes=plan.num_classes)


def _any_model(candidates: list[Candidate]) -> TrainResult | GbdtResult:
    """A model file for the constant predictor (its output map ignores the model): the first candidate's."""
    if not candidates:
        raise LabelDPError("no candidate could be fitted: too few rows in every training part",
                           code=ErrorCode.TOO_FEW_EXAMPLES)
    return candidates[0].model


def _report(plan: JobPlan, auto, final: Final | None, chosen: Scored | None, table: list[Scored],
            fell_back: bool, constant_of: Constant, estimate_rows: pd.DataFrame,
            preprocessor: Preprocessor, noisy: PrivatizedLabels, validation: schemas.Release) -> JobReport:
    """The final predictor against the constant on the estimate rows, the warnings, and what was chosen."""
    report, constant = JobReport(), constant_of.value
    metric = "accuracy" if plan.num_classes else ("poisson" if plan.loss == "poisson" else "mse")
    if final is None:
        predictions = _constant_output(plan, constant).apply(np.zeros((len(estimate_rows), 1)))
    else:
        predictions = _predictions(plan, final, estimate_rows, preprocessor)
    if metric == "accuracy":
        predictions = np.argmax(predictions, axis=1)
    comparison = compare(noisy, predictions, metric, constant=constant, level=REPORT_LEVEL)
    report.estimate = {**comparison.to_dict(), "release_id": validation.id, "mechanism": validation.mechanism}
    if final is None:
        why = ("the candidate chosen was worse than it on the estimate rows" if fell_back
               else "no candidate was shown to be better than it on the unbiased labels that judge them")
        report.warnings.append(f"auto chose the constant predictor ({comparison.constant_name}): {why}; the "
                               "labels at this ε carry too little signal for these features")
    elif (warning := comparison.warning()) is not None:
        report.warnings.append(warning)
    picked = {"candidate": "constant"} if final is None or chosen is None else {
        "candidate": chosen.candidate.name, "mechanism": chosen.candidate.design.training,
        "learner": chosen.candidate.learner, "regularization": chosen.candidate.variant, "weight": chosen.weight,
        "refitted": chosen.candidate.design.refit is not None}
    report.auto = {**auto.describe(), "constant": constant, "constant_source": constant_of.source,
                   "candidates": [scored.to_dict() for scored in table], "fell_back": fell_back,
                   "chosen": picked}
    return report
