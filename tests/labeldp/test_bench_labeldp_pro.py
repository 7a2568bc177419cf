"""``labeldp bench labeldp-pro`` end to end at a tiny size: its central trainings need a δ allocation (the bench
once granted none and every DP-SGD run failed with 409 delta_not_allocated). Runtime: about 20 s."""

from __future__ import annotations

import pandas as pd

from labeldp.cli import main


def test_a_tiny_labeldp_pro_bench_runs_every_method(tmp_path):
    out = tmp_path / "pro"
    assert main(["bench", "labeldp-pro", "--epsilons", "1", "--seeds", "1", "--steps", "20", "--out", str(out)]) == 0
    runs = pd.read_csv(out / "runs.csv")
    private = runs[runs.method != "non-private"]
    assert len(private) == 6 and private.accuracy.notna().all()
    assert (private.certified_epsilon <= 1.0 + 1e-9).all()
    central = private[private.method.str.startswith(("dp-sgd", "labeldp-pro"))]
    assert (central.delta == 1e-6).all() and (central.accuracy > 0.3).all()  # 10 classes: chance is 0.1
    pate = private[private.method.str.startswith("pate-fm")]  # the students (MLP, trees) of one PATE release
    assert len(pate) == 2 and (pate.delta == 1e-6).all() and (pate.certified_epsilon > 0.99).all()
    assert pate.certified_epsilon.nunique() == 1
    summary = (out / "summary.md").read_text()
    assert "| pate-fm (student) |" in summary and "| pate-fm-trees (student: trees) |" in summary
    assert "Mean predictor (predicting the majority class)" in summary and "Non-private reference" in summary
