"""`labeldp bench utility --model`: the private jobs train the chosen learner, the non-private reference is that
learner's (gradient-boosted trees trained in process with ``features_party.learn.gbdt`` on the true labels), runs.csv
and the summary name it, and with ``--model mlp,gbdt`` both learners train on the same release (one charge per cell).

Tiny runs through both services: 300 rows of the linear table of test_bench_table (the features explain nearly all
of the label's variance), unclipped Laplace at ε = 4, one seed."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from labeldp.cli import main
from tests.labeldp.test_bench_table import linear_table

RUN = ["--label", "y", "--clip", "0:300", "--rows", "300", "--seeds", "1", "--epsilons", "4",
       "--mechanisms", "laplace", "--epochs", "10"]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "linear.csv"
    linear_table(n=400).to_csv(path, index=False)
    return path


def _run(capsys, table, out, model: str) -> tuple[pd.DataFrame, str, list[dict]]:
    code = main(["bench", "utility", "--data", str(table), *RUN, "--model", model, "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return (pd.read_csv(out / "runs.csv"), (out / "summary.md").read_text(),
            json.loads((out / "datasets.json").read_text()))


def test_a_gbdt_bench_trains_trees_and_names_them(capsys, table, tmp_path):
    runs, summary, datasets = _run(capsys, table, tmp_path, "gbdt")
    assert list(runs["model"]) == ["gbdt", "gbdt"]  # the reference and the one private run
    reference = runs[runs.mechanism == "non-private"].iloc[0]
    # the trees' own reference: on labels this linear, far better than the training mean
    assert reference.test_loss < 0.2 * reference.constant_test_loss
    private = runs[runs.mechanism == "laplace"].iloc[0]
    assert 3.99 < private.certified_epsilon <= 4.0 and isinstance(private.release_id, str)
    assert np.isfinite(private.test_loss) and private.test_loss > reference.test_loss
    assert private.relative_test_loss == pytest.approx(
        (private.test_loss - reference.test_loss) / reference.test_loss)
    assert "### linear, learner gbdt: XGBoost gradient-boosted trees" in summary
    assert "learner mlp" not in summary
    assert (f"Non-private reference (a model trained on the true labels), test MSE: {reference.test_loss:.4g} ± —."
            in summary)
    assert (tmp_path / "linear-gbdt.png").read_bytes()[:4] == b"\x89PNG" and not (tmp_path / "linear.png").exists()
    assert datasets[0]["epsilon_per_example"]["releases"] == 4.0


def test_both_learners_train_on_the_same_release(capsys, table, tmp_path):
    runs, summary, datasets = _run(capsys, table, tmp_path, "mlp,gbdt")
    assert sorted(zip(runs.model, runs.mechanism, strict=True)) == [
        ("gbdt", "laplace"), ("gbdt", "non-private"), ("mlp", "laplace"), ("mlp", "non-private")]
    private = runs[runs.mechanism == "laplace"].set_index("model")
    assert private.loc["mlp", "release_id"] == private.loc["gbdt", "release_id"]  # one release, one charge
    assert private.loc["mlp", "noisy_label_loss"] == private.loc["gbdt", "noisy_label_loss"]
    assert datasets[0]["epsilon_per_example"]["releases"] == 4.0  # the budget granted: a single release at ε = 4
    references = runs[runs.mechanism == "non-private"].set_index("model")
    assert references.loc["mlp", "test_loss"] != references.loc["gbdt", "test_loss"]  # each learner's own
    assert references.loc["mlp", "constant_test_loss"] == references.loc["gbdt", "constant_test_loss"]
    mlp, gbdt = summary.index("### linear, learner mlp"), summary.index("### linear, learner gbdt")
    assert mlp < gbdt and summary.count("| laplace | ") == 5  # each learner's two tables, the comparison
    assert (tmp_path / "linear.png").exists() and (tmp_path / "linear-gbdt.png").exists()
    # the learners compared on the same release, after both learners' sections
    trees = private.loc["gbdt", "test_loss"] / private.loc["mlp", "test_loss"] - 1
    won = int(private.loc["gbdt", "test_loss"] < private.loc["mlp", "test_loss"])
    assert summary.index("### linear: trees against the MLP") > gbdt
    assert f"| laplace | {'**' * won}{100 * trees:+.1f} % ({won}/1){'**' * won} |" in summary
    assert "the best mechanism under each learner" not in summary  # one private mechanism: nothing to rank


def test_the_dry_run_names_the_learners_and_counts_their_jobs(capsys, table):
    def plan(*args: str) -> dict:
        code = main(["bench", "utility", "--dry-run", "--json", "--data", str(table), "--label", "y",
                     "--seeds", "2", "--epsilons", "1,4", "--mechanisms", "laplace,opt-unbiased", *args])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        return json.loads(captured.out)

    one, both = plan("--model", "gbdt"), plan("--model", "mlp,gbdt")
    assert one["models"] == ["gbdt"] and both["models"] == ["mlp", "gbdt"]
    assert plan()["models"] == ["mlp"]  # the default
    assert (one["jobs"], one["non_private_models"]) == (2 * 2 * 2, 2)
    assert (both["jobs"], both["non_private_models"]) == (2 * 2 * 2 * 2, 2 * 2)
    assert one["datasets"][0]["releases"] == both["datasets"][0]["releases"] == 2 * 2 * 2  # shared releases
    assert both["datasets"][0]["jobs_formula"] == "2 seeds × 2 ε × 2 private mechanisms × 2 learners"


def test_trees_take_no_label_sets_and_unknown_learners_are_refused(capsys, tmp_path):
    table = linear_table(seed=2, integer=False)
    table["y"] = np.where(table.y > 60, "high", np.where(table.y < 40, "low", "mid"))
    table.to_csv(tmp_path / "classes.csv", index=False)
    classes = ["bench", "utility", "--data", str(tmp_path / "classes.csv"), "--label", "y", "--kind", "classes",
               "--dry-run", "--json"]
    assert main([*classes, "--model", "mlp,gbdt"]) == 0
    plan = json.loads(capsys.readouterr().out)["datasets"][0]
    # the default: every mechanism; subset's sets and ALIBI's vectors train the MLP alone (one job each per cell)
    assert {"subset", "alibi", "lp-2st"} <= set(plan["mechanisms"])
    assert main([*classes, "--model", "gbdt"]) == 0
    mechanisms = json.loads(capsys.readouterr().out)["datasets"][0]["mechanisms"]
    assert "subset" not in mechanisms and "alibi" not in mechanisms and "lp-2st" in mechanisms  # trees alone
    assert main([*classes, "--model", "gbdt", "--mechanisms", "rr,subset"]) == 2
    assert main(["bench", "utility", "--model", "forest", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "subset" in err[0] and "--model gbdt" in err[0] and "unknown --model forest" in err[1]


def test_help_shows_the_default_learner(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "utility", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--model M[,M]" in text and "default: mlp)" in text and "gbdt: XGBoost" in text


def test_a_release_that_fell_back_says_so_in_every_learners_row(capsys, tmp_path):
    """RRWithPrior on a prior 97 % sure of one class keeps k = 1 at ε = 0.5 (it would release that class whatever
    the label): the labels service releases its fallback, plain RR, and says why in the release's description.
    Both learners' rows (one release) must say so, and the summary count it — the trainer's job view carries no
    description, so the bench reads the release itself (review of issue 32: the column was always empty)."""
    rng = np.random.default_rng(4)
    n = 400
    x = rng.normal(size=n)
    y = np.where(np.arange(n) < 12, np.where(x > 0, "b", "c"), "a")  # 97 % a
    path = tmp_path / "skewed.csv"
    pd.DataFrame({"x": x, "y": y}).to_csv(path, index=False)
    out = tmp_path / "out"
    code = main(["bench", "utility", "--data", str(path), "--label", "y", "--kind", "classes", "--seeds", "1",
                 "--epsilons", "0.5", "--mechanisms", "rr-with-prior", "--epochs", "2", "--model", "mlp,gbdt",
                 "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    runs = pd.read_csv(out / "runs.csv")
    private = runs[runs.mechanism == "rr-with-prior"].set_index("model")
    assert private.loc["mlp", "release_id"] == private.loc["gbdt", "release_id"]
    assert list(private["fallback"]) == ["uninformative", "uninformative"]
    assert (out / "summary.md").read_text().count("Fallbacks (the labels service released") == 2  # each learner
