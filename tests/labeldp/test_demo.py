"""The two-party demo runs end to end (quick mode: a 3000-example sample, one ε, few epochs)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from labeldp.demo import MECHANISMS, load_hours_worked, run_demo


@pytest.mark.slow
def test_quick_demo_writes_results_plot_and_a_complete_audit(tmp_path):
    rows = run_demo(tmp_path, [1.0], quick=True)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved == rows
    assert [r["mechanism"] for r in rows] == [m for m, _ in MECHANISMS] + ["non-private"]
    for row in rows[:-1]:
        assert row["epsilon"] == 1.0 and 0.99 < row["certified_epsilon"] <= 1.0
        assert np.isfinite(row["test_mse"]) and row["noisy_label_mse"] > 0
    assert rows[-1]["epsilon"] is None and rows[-1]["certified_epsilon"] is None
    hours = load_hours_worked()["hours"]
    assert rows[-1]["test_mse"] < 0.9 * hours.var()  # the features carry signal
    assert (tmp_path / "test_loss_vs_epsilon.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (tmp_path / "results.md").read_text()
    assert "4 privacy events, hash chain valid: True" in report
    assert "epsilon_spent = 4 of 4" in report
