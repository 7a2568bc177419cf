"""`labeldp bench utility --quick` (the CI-sized run): sane numbers and complete outputs."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from labeldp.cli import main


def test_quick_is_two_seeds_at_epsilon_one_and_two_on_psid_weeks(capsys):
    assert main(["bench", "utility", "--quick", "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["epsilons"], plan["seeds"], plan["epochs"]) == ([1.0, 2.0], 2, 8)
    assert [d["name"] for d in plan["datasets"]] == ["psid-weeks"] and plan["jobs"] == 40


@pytest.mark.slow
def test_quick_utility_benchmark(tmp_path, capsys):
    # --quick's grid with one seed on 4,000 of psid-weeks' rows: 21 trainings in about 2.5 minutes on 2 cores (the
    # seed fixes every draw, so the comparisons below are the same numbers on every run)
    assert main(["bench", "utility", "--dataset", "psid-weeks", "--epsilons", "1,2", "--seeds", "1", "--epochs", "8",
                 "--rows", "4000", "--out", str(tmp_path)]) == 0
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert len(runs) == 1 + 2 * 10  # non-private + 2 ε x (9 mechanisms + auto)
    private = runs[runs.mechanism != "non-private"]
    assert (private["certified_epsilon"] <= private["epsilon"]).all()
    assert (private["certified_epsilon"] >= private["epsilon"] - 1e-5).all()
    baseline = runs[runs.mechanism == "non-private"]["test_loss"].mean()
    means = private.groupby(["mechanism", "epsilon"])["test_loss"].mean()
    assert (means > baseline).all(), means  # the non-private model beats every private one
    assert set(private.groupby("mechanism").size().index) == {
        "laplace", "laplace-clipped", "staircase", "staircase-clipped", "rr-on-bins", "opt-unbiased",
        "opt-unbiased-mesh", "opt-unbiased-groups", "rp-with-prior", "auto"}
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


def test_resume_keeps_the_columns_a_classification_run_leaves_empty(tmp_path):
    """A classification run fills no test_loss: --resume must keep the column (it dropped empty cells, and the
    summary then failed with a KeyError on storm-status), and only complete cells (both learners, or auto's one)."""
    from types import SimpleNamespace

    from labeldp.benchmarks.utility import _resumed, _run_options

    config = SimpleNamespace(epsilons=[0.5], seeds=1, models=["mlp", "gbdt"], epochs=2, max_examples=None,
                             allow_uninformative=False, auto_candidates=None,
                             learners_of=lambda mechanism: ("mlp", "gbdt"))
    plans = [(SimpleNamespace(name="storm-status"), ["rr", "auto"])]
    (tmp_path / "run.json").write_text(json.dumps(_run_options(config, plans)))
    pd.DataFrame([
        {"dataset": "storm-status", "model": "mlp", "mechanism": "rr", "epsilon": 0.5, "seed": 0, "test_loss": None,
         "accuracy": 0.7},
        {"dataset": "storm-status", "model": "gbdt", "mechanism": "rr", "epsilon": 0.5, "seed": 0, "test_loss": None,
         "accuracy": 0.8},
        {"dataset": "storm-status", "model": "auto", "mechanism": "auto", "epsilon": 0.5, "seed": 0,
         "test_loss": None, "accuracy": 0.75},
        {"dataset": "storm-status", "model": "mlp", "mechanism": "rr", "epsilon": 0.5, "seed": 1, "test_loss": None,
         "accuracy": 0.6},  # seed 1's gbdt row never finished: the cell runs again
    ]).to_csv(tmp_path / "runs.csv", index=False)
    rows = _resumed(config, plans, tmp_path)
    assert [(r["mechanism"], r["model"], r["seed"]) for r in rows] == [("rr", "mlp", 0), ("rr", "gbdt", 0),
                                                                      ("auto", "auto", 0)]
    assert all("test_loss" in r and r["test_loss"] is None for r in rows)
    assert pd.DataFrame(rows)["accuracy"].tolist() == [0.7, 0.8, 0.75]
