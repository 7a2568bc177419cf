"""A finished job's report: its model against the constant predictor on its estimate rows' privatized labels
(:mod:`shared.validation`), and the warnings a user must see — the model not shown to be better than knowing
nothing, or no estimate at all and why. Written with the job's outcome (``jobs.report_json``) and shown in its view
(``estimate``, ``warnings``, ``auto``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from features_party.client import LabelsPartyClient
from shared import schemas
from shared.errors import ErrorCode, LabelDPError
from shared.mechanisms.documents import sampler_from_description
from shared.validation import Comparison, PrivatizedLabels, compare

METRICS = {"squared": "mse", "poisson": "poisson", "cross_entropy": "accuracy", "subset": "accuracy",
           "alibi": "accuracy"}


@dataclass
class JobReport:
    estimate: dict | None = None
    warnings: list[str] = field(default_factory=list)
    auto: dict | None = None
    shrinkage: dict | None = None

    def to_dict(self) -> dict:
        return {"estimate": self.estimate, "warnings": self.warnings, "auto": self.auto, "shrinkage": self.shrinkage}

    def add(self, comparison: Comparison, release: schemas.Release) -> None:
        self.estimate = {**comparison.to_dict(), "release_id": release.id, "mechanism": release.mechanism}
        warning = comparison.warning()
        if warning is not None:
            self.warnings.append(warning)


def labels_by_id(table: pa.Table) -> dict[str, float]:
    """A downloaded release's privatized labels by example id (a label-set release has none: empty)."""
    if "label" not in table.schema.names:
        return {}
    return dict(zip(table.column("example_id").to_pylist(), table.column("label").to_numpy().tolist(), strict=True))


def privatized(client: LabelsPartyClient, release: schemas.Release, noisy: np.ndarray,
               num_classes: int | None) -> PrivatizedLabels:
    """The release's labels with its mechanism, rebuilt from its published document; ``mechanism_biased`` when it
    cannot validate (a biased mechanism, or not K-ary randomized response for classes)."""
    if not release.mechanism_hash:
        raise LabelDPError(f"release {release.id} has no mechanism document", code=ErrorCode.MECHANISM_NOT_ESTIMABLE)
    document = client.mechanism_document(release.mechanism_hash)
    try:
        mechanism = sampler_from_description(document["description"])
    except LabelDPError as err:  # a group or label-set release: no single mechanism
        raise LabelDPError(f"release {release.id} ({release.mechanism}) has no single unbiased mechanism",
                           code=ErrorCode.MECHANISM_NOT_ESTIMABLE) from err
    return PrivatizedLabels(np.asarray(noisy, dtype=np.float64), mechanism, num_classes)


def estimate(report: JobReport, client: LabelsPartyClient, release: schemas.Release, noisy: np.ndarray,
             predictions: np.ndarray, loss: str, num_classes: int | None,
             constant: float | int | None = None) -> None:
    """Compares the model's ``predictions`` on the estimate rows (values, rates, or class probabilities) with the
    constant on their privatized ``noisy`` labels from ``release``; a release that cannot validate leaves a
    warning instead."""
    metric = METRICS[loss]
    try:
        labels = privatized(client, release, noisy, num_classes if metric == "accuracy" else None)
        if metric == "accuracy":
            predictions = np.argmax(predictions, axis=1)
        report.add(compare(labels, predictions, metric, constant=constant), release)
    except LabelDPError as err:
        if err.code not in ("mechanism_biased", "mechanism_not_estimable", "invalid_input"):
            raise
        report.warnings.append(f"no estimate of the model's test loss: {err}")
