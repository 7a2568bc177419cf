"""What summaries set private models against (labeldp/references.py) and the plot's reference lines
(labeldp/report.py): max |bias| rebuilt from mechanism documents, checked against values computed by hand; the one
sd rule; the flag of cells worse than the mean predictor; the lines the figure draws (read from matplotlib's Axes)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from labeldp import references, report
from labeldp.benchmarks.classification import ClassTable
from shared.domains import integer_range, lattice_of
from shared.mechanisms.additive import laplace
from shared.mechanisms.randomized_response import debiased_randomized_response, randomized_response


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 3.0])
def test_max_abs_bias_of_binary_rr_is_one_over_one_plus_e_to_the_epsilon(epsilon):
    """RR on {0, 1}: E[ỹ | 0] = Pr[flip] = 1/(1 + e^ε) and E[ỹ | 1] = 1 − 1/(1 + e^ε): |bias| 1/(1 + e^ε) at both
    (the document's probabilities are dyadic: within 2⁻³⁰)."""
    document = randomized_response([0.0, 1.0], epsilon).describe()
    assert references.max_abs_bias(document, [0.0, 1.0]) == pytest.approx(1 / (1 + math.exp(epsilon)), abs=2**-30)


def test_max_abs_bias_of_unbiased_mechanisms_is_zero_and_of_clipped_laplace_is_not():
    assert references.max_abs_bias(debiased_randomized_response([0.0, 1.0, 2.0], 1.0).describe(),
                                   [0.0, 1.0, 2.0]) < 1e-12
    domain = integer_range(0, 10)
    assert references.max_abs_bias(laplace(lattice_of(domain), 1.0).describe(), domain.values) == 0.0
    # clipping at [0, 10] pulls a label of 0 up: E[ỹ | 0] = E[max(0, min(10, Z))] > 0 for Z discrete Laplace
    clipped = laplace(lattice_of(domain), 1.0, clip=True, input_values=domain.values)
    assert references.max_abs_bias(clipped.describe(), domain.values) == pytest.approx(clipped.max_abs_bias)
    assert clipped.max_abs_bias > 1.0


def test_max_abs_bias_of_a_group_release_is_the_largest_over_its_groups():
    """A group release's columnar document: each randomizer once, its values omitted where they are the grid."""
    grid = [0.0, 1.0]
    parts = [{k: v for k, v in randomized_response(grid, e).describe().items()
              if k not in ("input_values", "output_values")} for e in (1.0, 2.0)]
    document = {"grid": grid, "mechanisms": parts, "noisy_prior": None, "groups": {"group": ["a", "b"]}}
    assert references.max_abs_bias(document, grid) == pytest.approx(1 / (1 + math.e), abs=2**-30)
    assert references.max_abs_bias({"mechanism": "subset", "p_true": 0.5}, grid) is None  # a set per label


def test_sd_is_the_sample_sd_for_every_row():
    assert references.sd([1.0, 3.0]) == pytest.approx(math.sqrt(2))  # ddof = 1 (ddof = 0 would give 1)
    assert math.isnan(references.sd([5.0]))
    assert references.mean_sd([1.0, 3.0]) == "2 ± 1.4"
    assert references.mean_sd([5.0]) == "5 ± —"


def test_cells_worse_than_the_mean_predictor_are_marked_and_named():
    refs = references.Yardsticks(non_private=(40.0, 42.0), constant=(300.0, 320.0))
    assert refs.mark(311.0, "311") == "311 ⚠" and refs.mark(309.0, "309") == "309"
    warning = refs.warning({("laplace", 0.5): 900.0, ("laplace", 8.0): 100.0, ("rr-on-bins", 0.5): 311.0,
                            ("rr-on-bins", 1.0): 2000.0})
    assert warning == ("**Warning** ⚠: worse than predicting the training mean (310), so of no use as released: "
                       "laplace at ε = 0.5; rr-on-bins at ε = 0.5, 1.")
    assert refs.warning({("laplace", 8.0): 100.0}) is None
    accuracy = references.Yardsticks(non_private=(0.95,), constant=(0.11,), higher_is_better=True)
    assert accuracy.worse_than_constant(0.10) and not accuracy.worse_than_constant(0.5)
    assert accuracy.lines("test accuracy", ".3f") == [
        "Non-private reference (a model trained on the true labels), test accuracy: 0.950 ± —.",
        "Mean predictor (predicting the majority class), test accuracy: 0.110 ± —."]


def test_majority_class_accuracy_of_a_digits_split():
    digits = ClassTable.digits()
    fit, test = digits.split(0)
    majority = np.bincount(digits.y[fit]).argmax()
    assert digits.majority_accuracy(0) == pytest.approx(np.mean(digits.y[test] == majority))
    assert 0.05 < digits.majority_accuracy(0) < 0.15  # ten nearly balanced classes


def test_the_figure_draws_both_references_as_horizontal_lines_with_legend_entries():
    runs = pd.DataFrame({"mechanism": ["laplace"] * 4 + ["rr-on-bins"] * 4, "epsilon": [1.0, 1.0, 4.0, 4.0] * 2,
                         "test_loss": [900.0, 1100.0, 200.0, 220.0, 500.0, 520.0, 300.0, 310.0],
                         "noisy_label_loss": [80.0, 82.0, 10.0, 11.0, 5.0, 6.0, 2.0, 2.5]})
    refs = references.Yardsticks(non_private=(40.0, 44.0), constant=(300.0, 320.0))
    figure = report.loss_vs_epsilon_figure(runs, test="test_loss", noisy="noisy_label_loss", test_label="test MSE",
                                           title="t", references=refs.plot_lines())
    left = figure.axes[0]
    lines = {line.get_label(): line for line in left.get_lines()}
    for label, value in (("non-private (true labels)", 42.0), ("predicting the training mean", 310.0)):
        assert list(lines[label].get_ydata()) == [value, value]  # axhline: constant y across the axis
        assert list(lines[label].get_xdata()) == [0, 1]  # in axes coordinates: the whole width
    legend = [text.get_text() for text in left.get_legend().get_texts()]
    assert {"laplace", "rr-on-bins", "non-private (true labels)", "predicting the training mean"} <= set(legend)
    # the error bars are the sample sd: laplace at ε = 1 is 1000 ± √(2·100²) = 141.4
    [laplace_bars] = [c for c in left.containers if c.get_label() == "laplace"]
    segments = laplace_bars.lines[2][0].get_segments()
    low, high = segments[0][:, 1]
    assert (high - low) / 2 == pytest.approx(references.sd([900.0, 1100.0])) == pytest.approx(141.42, abs=0.01)
    import matplotlib.pyplot as plt

    plt.close(figure)


def test_a_relative_loss_of_zero_is_drawn_on_a_symlog_axis():
    runs = pd.DataFrame({"mechanism": ["laplace"] * 2, "epsilon": [1.0, 4.0], "rel": [0.5, 0.1], "noisy": [3.0, 1.0]})
    refs = references.Yardsticks(non_private=(0.0,), constant=(0.8,))
    figure = report.loss_vs_epsilon_figure(runs, test="rel", noisy="noisy", test_label="relative",
                                           title="t", references=refs.plot_lines())
    assert figure.axes[0].get_yscale() == "symlog" and figure.axes[1].get_yscale() == "log"
    assert [line.get_ydata()[0] for line in figure.axes[0].get_lines()[-2:]] == [0.0, 0.8]
    import matplotlib.pyplot as plt

    plt.close(figure)


def test_a_bench_class_table_is_split_as_bench_utility_splits_it():
    """``labeldp bench labeldp-pro --table storm-status`` holds out the storms ``bench utility`` holds out (the
    same seed, the same draw), so PATE-FM's numbers stand beside the peers' runs of that table."""
    from labeldp.benchmarks.labeldp_pro import bench_table
    from labeldp.benchmarks.utility import DATASETS, _split

    prepared = DATASETS["storm-status"].prepare()
    table = bench_table(prepared)
    for seed in (0, 3):
        fit, test = table.split(seed)
        train_part, test_part = _split(prepared.frame, prepared, seed)
        assert set(table.ids[test]) == set(test_part["example_id"]) and len(fit) == len(train_part)
        assert not set(prepared.frame[prepared.group].iloc[test]) & set(prepared.frame[prepared.group].iloc[fit])
    assert table.num_classes == 9 and table.x.shape == (len(prepared.frame), len(prepared.numeric))
    np.testing.assert_allclose(table.x.mean(axis=0), 0, atol=1e-5)
