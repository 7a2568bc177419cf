"""Multi-stage training with RRWithPrior (LP-MST, "Deep Learning with Label DP", Section 5 and its supplement).

The training examples are split into T stages at random — a partition that does not look at labels. Stage 1 asks
the labels party for plain randomized response (RRWithPrior under a uniform prior is RR over all K classes) and
trains a model. Stage t > 1 sends, for each of its examples, the current model's softmax (with a temperature) as
that example's prior; the labels party answers with RRWithPrior, leaving out the examples whose prior gives k = 1
(RR-Top-1 would release the prior's most likely class whatever the label): they take that class as their label,
computed here and charged nothing. Every other example is released once, at ε, so by parallel composition over the
disjoint stages the whole run is ε-label-DP — the labels party's per-example ledger enforces and audits exactly
that. A stage where every example has k = 1 is refused before any charge and adds no labels. Stage t trains on
all labels so far, starting from the stage t−1 model, and drops earlier-stage labels that fall outside the current
model's top-k (k = the mean k of the stage's RRWithPrior answers), as the supplement describes. The MLP starts from
the last stage's parameters; gradient-boosted trees (features_party/learn/gbdt.py) go on boosting the last stage's
model, each stage adding up to ``n_estimators`` rounds, and the softmax of their margins is the next stage's prior.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import jax
import numpy as np

from features_party.client import LabelsPartyClient, LabelsPartyError
from features_party.learn.gbdt import GbdtConfig, GbdtResult, train_gbdt
from features_party.learn.train import Deadline, TrainConfig, TrainResult, train
from features_party.parts import lp_mst_parts
from shared import models


@dataclass
class StageReport:
    stage: int
    examples: int
    release_id: str | None  # None: the stage was not released (see ``skipped``)
    mean_k: float
    trained_on: int
    certified_epsilon: float
    skipped: str | None = None  # why the stage's labels were not released (nothing was spent on them)
    uninformative: int = 0  # examples left out of the release (k = 1), labelled with their prior's argmax


class MultistageRun(NamedTuple):
    model: TrainResult | GbdtResult  # the last stage's
    reports: list[StageReport]
    labels: np.ndarray  # each example's label as the stages left it (released, or its prior's argmax); -1: none


def _logits(result: TrainResult | GbdtResult, numeric, categorical) -> np.ndarray:
    if isinstance(result, GbdtResult):
        return result.logits(numeric, categorical)
    return np.asarray(models.apply(result.params, numeric, categorical))


def _fit(config: TrainConfig | GbdtConfig, numeric: np.ndarray, categorical: np.ndarray, labels: np.ndarray, *,
         vocab_sizes, num_classes: int, previous: TrainResult | GbdtResult | None,
         deadline: float | Deadline | None, threads: int | None, validate_on: np.ndarray) -> TrainResult | GbdtResult:
    """A stage's model, starting from the last stage's: the MLP from its parameters, trees boosting on; validated
    on ``validate_on``, the stage's own released labels."""
    if isinstance(config, GbdtConfig):
        assert previous is None or isinstance(previous, GbdtResult)
        return train_gbdt(config, numeric, categorical, labels, num_classes=num_classes, deadline=deadline,
                          init_model=None if previous is None else previous.booster, threads=threads,
                          validate_on=validate_on)
    assert previous is None or isinstance(previous, TrainResult)
    return train(config, numeric, categorical, labels, vocab_sizes=vocab_sizes, num_classes=num_classes,
                 init_params=None if previous is None else previous.params, deadline=deadline,
                 validate_on=validate_on)


def _stage_release(client: LabelsPartyClient, dataset_id: str, ids: list[str], priors: np.ndarray | None,
                   epsilon: float, key: str):
    """A stage's release: RR without ``priors`` (the first stage), RRWithPrior with them; None when the labels
    party refused it as uninformative (every example's k = 1), before any charge."""
    if priors is None:
        return client.request_release(dataset_id, {"mechanism": "rr", "epsilon": epsilon, "example_ids": ids},
                                      idempotency_key=key)
    try:
        return client.request_prior_release(dataset_id, ids, priors, epsilon, idempotency_key=key)
    except LabelsPartyError as err:
        if err.code != "uninformative_release":
            raise
        return None


def _take_labels(table, release, ids: list[str], rows: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Write a stage's released labels into ``labels`` at ``rows``; which of the stage's ``ids`` the release holds
    (the others were left out as uninformative, which the release must say)."""
    position = {example: i for i, example in enumerate(table.column("example_id").to_pylist())}
    noisy = table.column("label").to_numpy()
    found = np.array([i in position for i in ids], dtype=bool)
    uninformative = int((~found).sum())
    if uninformative != release.description.get("uninformative_examples", 0):  # a release always says so
        raise ValueError(f"release {release.id} lacks {uninformative} of the stage's examples but says it left "
                         f"out {release.description.get('uninformative_examples', 0)}")
    labels[rows[found]] = np.rint(noisy[[position[i] for i in ids if i in position]]).astype(np.int64)
    return found


def _in_top_k(result, numeric: np.ndarray, categorical: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """Whether each label is among the model's ``k`` most likely classes for its example."""
    top = np.argsort(-_logits(result, numeric, categorical), axis=1)[:, :k]
    return np.any(top == labels[:, None], axis=1)


def train_multistage(client: LabelsPartyClient, dataset_id: str, example_ids: np.ndarray, numeric: np.ndarray,
                     categorical: np.ndarray, *, vocab_sizes, num_classes: int, epsilon: float, stages: int,
                     config: TrainConfig | GbdtConfig, temperature: float = 1.0, seed: int = 0,
                     fractions: list[float] | None = None, key_prefix: str = "",
                     deadline: float | Deadline | None = None,
                     threads: int | None = None) -> MultistageRun:
    """LP-MST with T = ``stages`` (1 is LP-1ST, i.e. plain RR). Returns the final model, a per-stage report and
    the examples' labels.
    Each stage's release has the Idempotency-Key ``key_prefix`` + the run's parameters + the stage: a rerun with
    the same prefix (a resumed job) gets the same releases back instead of new draws and charges. Past
    ``deadline`` (``time.monotonic()``, or a :class:`~features_party.learn.train.Deadline`) a stage's training raises
    ``TimeLimitExceeded`` (or ``Stopped``): no later stage is released."""
    if stages < 1:
        raise ValueError("stages must be >= 1")
    n = len(example_ids)
    parts = lp_mst_parts(n, stages, seed, fractions)
    config = replace(config, loss="cross_entropy")
    labels = np.full(n, -1, dtype=np.int64)
    labelled = np.zeros(n, dtype=bool)
    result: TrainResult | GbdtResult | None = None
    reports: list[StageReport] = []
    for stage, rows in enumerate(parts, start=1):
        ids = [str(i) for i in example_ids[rows]]
        key = f"{key_prefix}lp-mst-{seed}-{stages}-{stage}-{epsilon}-{n}"
        priors = None if result is None else \
            np.asarray(jax.nn.softmax(_logits(result, numeric[rows], categorical[rows]) / temperature))
        release = _stage_release(client, dataset_id, ids, priors, epsilon, key)
        if release is None:
            # The model is so confident on this stage's examples (k = 1 for each at this ε) that RRWithPrior
            # would release its own predictions: refused before any charge, and these examples keep their
            # budget. No labels arrived, so the model is unchanged; later stages hold other examples, on
            # which it may be less sure.
            reports.append(StageReport(stage, len(rows), None, 1.0, 0, 0.0, skipped="uninformative_release"))
            continue
        mean_k = float(num_classes)
        found = _take_labels(client.download_labels(release.id), release, ids, rows, labels)
        uninformative = int((~found).sum())
        if priors is not None:
            # The examples left out of the release are exactly those whose prior gives k = 1: RR-Top-1 would have
            # released the prior's most likely class (ties to the smaller class, as the labels party sorts them),
            # computed here and charged nothing. The stage's mean k counts them (k = 1).
            labels[rows[~found]] = np.argmax(priors[~found], axis=1)
            mean_k = (float(release.description["mean_k"]) * (len(rows) - uninformative) + uninformative) / len(rows)
        labelled[rows] = True
        use = labelled.copy()
        if result is not None:  # drop earlier-stage labels outside the current model's top-k
            earlier = labelled & ~np.isin(np.arange(n), rows)
            use[np.flatnonzero(earlier)[~_in_top_k(result, numeric[earlier], categorical[earlier], labels[earlier],
                                                    max(1, int(round(mean_k))))]] = False
        released = np.zeros(n, dtype=bool)  # this stage's examples whose labels its release drew
        released[rows[found]] = True
        result = _fit(config, numeric[use], categorical[use], labels[use], vocab_sizes=vocab_sizes,
                      num_classes=num_classes, previous=result, deadline=deadline, threads=threads,
                      validate_on=released[use])
        certified = release.certified_epsilon
        assert certified is not None  # its labels were downloaded: the release is available, its mechanism built
        reports.append(StageReport(stage, len(rows), release.id, mean_k, int(use.sum()), certified,
                                   uninformative=uninformative))
    assert result is not None  # stages >= 1: at least one stage trained
    return MultistageRun(result, reports, labels)
