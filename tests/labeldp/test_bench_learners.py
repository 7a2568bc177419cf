"""The summary's learner comparison (:mod:`labeldp.benchmarks.learners`) on hand-made runs whose answers are known:
trees against the MLP paired by seed, and the best mechanism under each learner with its paired wins."""

from __future__ import annotations

import pandas as pd
import pytest

from labeldp.benchmarks import learners


def _runs(values: dict[tuple[str, str, float | None], list[float]], column: str = "test_loss") -> pd.DataFrame:
    rows = [{"dataset": "d", "model": model, "mechanism": mechanism, "epsilon": epsilon, "seed": seed, column: v}
            for (model, mechanism, epsilon), seeds in values.items() for seed, v in enumerate(seeds)]
    return pd.DataFrame(rows)


LOSSES = {
    ("mlp", "non-private", None): [10.0, 12.0, 11.0],
    ("gbdt", "non-private", None): [5.0, 6.0, 4.0],
    ("mlp", "a", 1.0): [20.0, 20.0, 20.0],
    ("gbdt", "a", 1.0): [10.0, 12.0, 8.0],  # trees better in every seed, mean 10 vs 20: −50 %
    ("mlp", "b", 1.0): [30.0, 30.0, 30.0],
    ("gbdt", "b", 1.0): [33.0, 36.0, 30.0],  # mean +10 %, trees better in no seed (one tie): seeds disagree
    ("mlp", "a", 2.0): [15.0, 15.0, 15.0],
    ("gbdt", "a", 2.0): [16.0, 17.0, 18.0],  # MLP better in every seed, +13.3 %
    ("mlp", "b", 2.0): [14.0, 14.0, 16.0],  # b beats a under the MLP at ε = 2 by mean (14.67 vs 15), in 2 seeds
    ("gbdt", "b", 2.0): [14.0, 13.0, 20.0],  # mean 15.67: a (17) loses to b under trees too, b wins 2/3
}


def test_trees_against_the_mlp_is_paired_by_seed():
    text = "\n".join(learners.learner_lines(_runs(LOSSES), learners.scoring_for(False), ["a", "b"], [1.0, 2.0]))
    assert "Non-private (true labels): -54.5 % (3/3)." in text  # 5 vs 11
    assert "| a | **-50.0 % (3/3)** | +13.3 % (0/3) |" in text
    assert "| b | +10.0 % (0/3) | +6.8 % (1/3) |" in text  # 15.67 / 14.67 − 1
    assert "Trees better in every seed: non-private; a at ε = 1." in text
    assert "MLP better in every seed: a at ε = 2." in text
    # b at ε = 1 has a tie in seed 2, so neither learner is better in every seed
    assert "Seeds disagree: b at ε = 1, 2." in text


def test_the_best_mechanism_under_each_learner_names_its_runner_up_and_paired_wins():
    runs = _runs(LOSSES)
    scoring = learners.scoring_for(False)
    assert learners.best_mechanism(runs, scoring, "mlp", ["a", "b"], 1.0)[:2] == ("a", "b")
    best, second, paired = learners.best_mechanism(runs, scoring, "mlp", ["a", "b"], 2.0)
    assert (best, second, paired.wins(scoring), paired.seeds) == ("b", "a", 2, 3)
    text = "\n".join(learners.winner_lines(runs, scoring, ["mlp", "gbdt"], ["a", "b"], [1.0, 2.0]))
    assert "| mlp | a (vs b: 3/3) | b (vs a: 2/3) |" in text
    assert "| gbdt | a (vs b: 3/3) | b (vs a: 2/3) |" in text
    assert "a is best under mlp at ε = 1; gbdt at ε = 1." in text
    assert "b is best under mlp at ε = 2; gbdt at ε = 2." in text


def test_accuracy_is_compared_in_percentage_points_and_higher_wins():
    runs = _runs({("mlp", "non-private", None): [0.80, 0.82], ("gbdt", "non-private", None): [0.85, 0.83],
                  ("mlp", "rr", 1.0): [0.50, 0.60], ("gbdt", "rr", 1.0): [0.55, 0.58],
                  ("mlp", "lp-2st", 1.0): [0.70, 0.72], ("gbdt", "lp-2st", 1.0): [0.75, 0.80]}, "accuracy")
    scoring = learners.scoring_for(True)
    text = "\n".join(learners.learner_lines(runs, scoring, ["rr", "lp-2st"], [1.0]))
    assert "Non-private (true labels): +3.0 pp (2/2)." in text
    assert "| rr | +1.5 pp (1/2) |" in text and "| lp-2st | **+6.5 pp (2/2)** |" in text
    assert learners.best_mechanism(runs, scoring, "gbdt", ["rr", "lp-2st"], 1.0)[0] == "lp-2st"


def test_a_mechanism_one_learner_cannot_train_is_a_dash():
    """Subset releases are for the MLP only: its trees' cell is empty, not a comparison with nothing."""
    runs = _runs({("mlp", "non-private", None): [1.0], ("gbdt", "non-private", None): [1.0],
                  ("mlp", "subset", 1.0): [2.0]})
    text = "\n".join(learners.learner_lines(runs, learners.scoring_for(False), ["subset"], [1.0]))
    assert "| subset | — |" in text and "subset" not in text.split("\n\n")[-1]


@pytest.mark.parametrize("classification, column", [(False, "test_loss"), (True, "accuracy")])
def test_learners_are_compared_on_the_absolute_metric(classification, column):
    """Never on the relative Poisson loss, which is relative to each learner's own non-private model."""
    assert learners.scoring_for(classification).column == column
