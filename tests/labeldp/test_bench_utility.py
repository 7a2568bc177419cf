"""`labeldp bench utility --quick` (the CI-sized run): sane numbers and complete outputs."""

from __future__ import annotations

import pandas as pd
import pytest

from labeldp.cli import main


@pytest.mark.slow
def test_quick_utility_benchmark(tmp_path, capsys):
    assert main(["bench", "utility", "--quick", "--out", str(tmp_path)]) == 0
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert len(runs) == 2 * (1 + 2 * 9)  # 2 seeds x (non-private + 2 ε x (8 mechanisms + auto))
    private = runs[runs.mechanism != "non-private"]
    assert (private["certified_epsilon"] <= private["epsilon"]).all()
    assert (private["certified_epsilon"] >= private["epsilon"] - 1e-5).all()
    baseline = runs[runs.mechanism == "non-private"]["test_loss"].mean()
    means = private.groupby(["mechanism", "epsilon"])["test_loss"].mean()
    assert (means > baseline).all(), means  # the non-private model beats every private one
    assert set(private.groupby("mechanism").size().index) == {
        "laplace", "laplace-clipped", "staircase", "staircase-clipped", "rr-on-bins", "opt-unbiased",
        "opt-unbiased-mesh", "opt-unbiased-groups", "auto"}
    # unbiased mechanisms have far larger noisy-label loss than the biased ones (the paper's observation)
    noisy = private.groupby("mechanism")["noisy_label_loss"].mean()
    assert noisy["opt-unbiased"] > 10 * noisy["rr-on-bins"]
    assert (tmp_path / "psid-weeks.png").read_bytes()[:4] == b"\x89PNG"
    assert "| opt-unbiased-mesh |" in (tmp_path / "summary.md").read_text()
    assert "# Privacy–utility benchmark" in capsys.readouterr().out


def test_bad_arguments_are_one_line_errors(capsys):
    assert main(["bench", "utility", "--dataset", "nope"]) == 2
    assert main(["bench", "utility", "--epsilons", "0,1"]) == 2
    assert main(["bench", "utility", "--seeds", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("labeldp: error:") for line in err)
