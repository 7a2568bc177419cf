"""The utility bench's summary is honest (issue 31): the non-private model and the mean predictor appear although
`non-private` is not among the mechanisms, a cell worse than the mean predictor is flagged and named, the max
|bias| of the release's mechanism stands next to its noisy-label loss, and every sd is the sample sd (ddof = 1).

One small run through both services: 300 rows of a linear relation, integer labels declared on [0, 300] (far wider
than the labels, ~50 ± 17), unclipped Laplace — unbiased, bias 0 — at ε = 0.02 (noise of scale 15,000 labels: far
worse than the training mean) and ε = 50 (scale 6: far better)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from labeldp import references
from labeldp.cli import main
from tests.labeldp.test_bench_table import linear_table


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("summary")
    linear_table(n=300).to_csv(tmp / "linear.csv", index=False)
    out = tmp / "out"
    assert main(["bench", "utility", "--data", str(tmp / "linear.csv"), "--label", "y", "--clip", "0:300",
                 "--seeds", "2", "--epsilons", "0.02,50", "--mechanisms", "laplace", "--epochs", "15",
                 "--out", str(out)]) == 0
    return pd.read_csv(out / "runs.csv"), (out / "summary.md").read_text()


def _rows(summary: str, mechanism: str) -> list[list[str]]:
    """The mechanism's cells in each table: the test metric's, then the noisy-label loss's."""
    return [[cell.strip() for cell in line.strip("|").split("|")[1:]] for line in summary.splitlines()
            if line.startswith(f"| {mechanism} | ")]


def test_references_appear_without_non_private_in_the_mechanisms(bench):
    runs, summary = bench
    reference = runs[runs.mechanism == "non-private"]
    assert sorted(reference.seed) == [0, 1]  # trained for every seed although not asked for
    mse, constant = reference["test_loss"].to_numpy(), reference["constant_test_loss"].to_numpy()
    assert (mse < 0.3 * constant).all()  # the features explain the label: the reference beats the mean by far
    # both lines state mean ± sample sd (ddof = 1) over the two seeds
    assert (f"Non-private reference (a model trained on the true labels), test MSE: {np.mean(mse):.4g} ± "
            f"{np.std(mse, ddof=1):.2g}.") in summary
    assert (f"Mean predictor (predicting the training mean), test MSE: {np.mean(constant):.4g} ± "
            f"{np.std(constant, ddof=1):.2g}.") in summary
    assert references.SD_RULE in summary


def test_the_cell_worse_than_the_mean_predictor_is_flagged_and_named(bench):
    runs, summary = bench
    private = runs[runs.mechanism == "laplace"]
    constant = runs[runs.mechanism == "non-private"]["constant_test_loss"].mean()
    low, high = (private[private.epsilon == e]["test_loss"].to_numpy() for e in (0.02, 50.0))
    assert low.mean() > constant > high.mean()  # the run plants one cell on each side of the mean predictor
    cells = _rows(summary, "laplace")[0]
    # private cells: the same sample sd (ddof = 1) as the reference lines; the only mechanism is the best (bold)
    # at each ε, and still worse than the mean predictor at ε = 0.02
    assert cells[0] == f"**{low.mean():.4g} ± {np.std(low, ddof=1):.2g}** ⚠"
    assert cells[1] == f"**{high.mean():.4g} ± {np.std(high, ddof=1):.2g}**"
    warning = next(line for line in summary.splitlines() if line.startswith("**Warning**"))
    assert warning == (f"**Warning** ⚠: worse than predicting the training mean ({constant:.4g}), so of no use as "
                       "released: laplace at ε = 0.02.")


def test_max_abs_bias_stands_next_to_the_noisy_label_loss(bench):
    runs, summary = bench
    private = runs[runs.mechanism == "laplace"]
    assert (private["max_abs_bias"] == 0.0).all()  # unclipped Laplace on the lattice: unbiased, exactly
    noisy = private.groupby("epsilon")["noisy_label_loss"].mean()
    assert _rows(summary, "laplace")[1] == [f"{noisy[0.02]:.4g} (bias 0)", f"{noisy[50.0]:.4g} (bias 0)"]
    assert references.NOISY_LOSS_CAVEAT in summary
    assert re.search(r"max \|bias\| max_y \|E\[ỹ \| y\] − y\|", summary)
