"""What a Spark release draws is what the mechanism says: on 10⁶ labels, for every input label, the released values
follow the same distribution as the in-process sampler's (two-sample χ²) and the mechanism's exact matrix row (χ²
goodness of fit); a sampler with a known defect fails the same checks; and partitions draw independent streams."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pytest
from scipy import stats

from labels_party.core.registry import MechanismOptions, build_mechanism
from labels_party.spark.jobs import label_histogram, privatize
from shared.domains import integer_range
from tests.labels_party.spark.samplers import MisalignedOutputs
from tests.labels_party.spark.sources import read_all, read_parts, write_source

DOMAIN = integer_range(1, 10)
ROWS = 1_000_000
SECRET = b"distribution-agreement-secret-32"
ALPHA = 1e-3  # per input label; fixed seeds and secret, so the test is deterministic


@pytest.fixture(scope="module")
def release(spark, tmp_path_factory):
    """10⁶ labels from a skewed prior in 4 files, the opt-unbiased mechanism (mesh LP, 20 outputs) at ε = 1 built
    from the source's exact histogram, released once by Spark and once in process."""
    rng = np.random.default_rng(2025)
    prior = np.linspace(1.0, 3.0, 10) ** 2
    labels = rng.choice(DOMAIN.values, size=ROWS, p=prior / prior.sum())
    directory = tmp_path_factory.mktemp("distribution")
    source = write_source(directory / "source", np.arange(ROWS), labels, files=4)
    histogram = label_histogram(spark, source, DOMAIN.values)
    mechanism = build_mechanism("opt-unbiased", DOMAIN, 1.0, histogram.counts, MechanismOptions(mesh=20))
    result = privatize(spark, source, str(directory / "released"), mechanism, SECRET, support_values=DOMAIN.values)
    in_process = mechanism.sample(labels, np.random.default_rng(7))
    return {"source": source, "directory": directory, "labels": labels, "mechanism": mechanism, "result": result,
            "spark": _aligned(result.output, labels), "in_process": in_process}


def _aligned(output: str, labels: np.ndarray) -> np.ndarray:
    """The released value of every example, in the source's order (example_id is the source row's index)."""
    released = read_all(output)
    rows = pc.cast(released.column("example_id"), "int64").to_numpy()
    aligned = np.full(labels.size, np.nan)
    aligned[rows] = released.column("label").to_numpy()
    assert np.sort(rows).tolist() == list(range(labels.size))  # every example released exactly once
    return aligned


def _conditional_counts(mechanism, labels, released) -> np.ndarray:
    """counts[i, j]: examples with label input_values[i] released as output_values[j]."""
    rows = mechanism.row_of(labels)
    columns = np.searchsorted(mechanism.output_values, released)
    assert np.all(mechanism.output_values[columns] == released)  # nothing outside the mechanism's outputs
    shape = (mechanism.input_values.size, mechanism.output_values.size)
    return np.bincount(rows * shape[1] + columns, minlength=shape[0] * shape[1]).reshape(shape)


def _pooled(observed: np.ndarray, expected: np.ndarray, minimum: float = 5.0) -> tuple[np.ndarray, np.ndarray]:
    """Cells whose expected count is below ``minimum`` merged into one (χ²'s approximation needs ~5 per cell)."""
    small = expected < minimum
    if not small.any():
        return observed, expected
    return (np.append(observed[..., ~small], observed[..., small].sum(axis=-1, keepdims=True), axis=-1),
            np.append(expected[~small], expected[small].sum()))


def two_sample_p_values(mechanism, labels, first, second) -> np.ndarray:
    """Per input label: χ² test that two samplers' released values have the same distribution."""
    a, b = _conditional_counts(mechanism, labels, first), _conditional_counts(mechanism, labels, second)
    p_values = []
    for row_a, row_b in zip(a, b, strict=True):
        table, _ = _pooled(np.vstack([row_a, row_b]), (row_a + row_b) / 2.0)
        p_values.append(stats.chi2_contingency(table, correction=False).pvalue)
    return np.array(p_values)


def goodness_of_fit_p_values(mechanism, labels, released) -> np.ndarray:
    """Per input label: χ² test of the released values against the mechanism's exact row; an output the matrix
    gives probability 0 is a failure outright (p = 0)."""
    counts = _conditional_counts(mechanism, labels, released)
    p_values = []
    for observed, probabilities in zip(counts, mechanism.matrix, strict=True):
        if observed[probabilities == 0].any():
            p_values.append(0.0)
            continue
        observed, expected = _pooled(observed, observed.sum() * probabilities)
        p_values.append(stats.chisquare(observed, expected).pvalue)
    return np.array(p_values)


def test_spark_and_in_process_releases_agree(release):
    assert release["result"].rows_written == ROWS and release["result"].partitions == 4
    p_values = two_sample_p_values(release["mechanism"], release["labels"], release["spark"], release["in_process"])
    assert np.all(p_values > ALPHA), p_values


def test_spark_release_follows_the_mechanism_matrix(release):
    mechanism = release["mechanism"]
    assert mechanism.matrix.shape[0] == 10 and mechanism.matrix.shape[1] > 5
    p_values = goodness_of_fit_p_values(mechanism, release["labels"], release["spark"])
    assert np.all(p_values > ALPHA), p_values
    in_process = goodness_of_fit_p_values(mechanism, release["labels"], release["in_process"])
    assert np.all(in_process > ALPHA), in_process


def test_a_wrong_sampler_is_detected(spark, release):
    """The same checks fail on a release whose values are right but shifted by one row within each Arrow batch
    (its output marginal is the mechanism's; the labels' conditionals are not)."""
    mechanism, labels = release["mechanism"], release["labels"]
    wrong = privatize(spark, release["source"], str(release["directory"] / "wrong"), MisalignedOutputs(mechanism),
                      SECRET, support_values=DOMAIN.values)
    shifted = _aligned(wrong.output, labels)
    marginal = np.unique(shifted, return_counts=True)[1], np.unique(release["spark"], return_counts=True)[1]
    assert stats.chi2_contingency(np.vstack(marginal)).pvalue > ALPHA  # the marginal alone cannot tell
    assert np.min(goodness_of_fit_p_values(mechanism, labels, shifted)) < 1e-12
    assert np.min(two_sample_p_values(mechanism, labels, shifted, release["in_process"])) < 1e-12


def test_partitions_draw_independent_streams(release):
    """Row k of two partitions, given the same label, get the same released value about as often as two
    independent draws would (Σ_j P[j|y]²): not always, as one key shared by the partitions would make them."""
    mechanism = release["mechanism"]
    parts = read_parts(release["result"].output)
    first, second = ([pc.cast(part.column("example_id"), "int64").to_numpy(), part.column("label").to_numpy()]
                     for part in parts[:2])
    size = min(first[0].size, second[0].size)
    same_label = release["labels"][first[0][:size]] == release["labels"][second[0][:size]]
    rows = mechanism.row_of(release["labels"][first[0][:size]][same_label])
    collisions = first[1][:size][same_label] == second[1][:size][same_label]
    expected = np.sum(mechanism.matrix**2, axis=1)[rows]
    assert same_label.sum() > 10_000
    assert abs(collisions.sum() - expected.sum()) < 5 * np.sqrt(np.sum(expected * (1 - expected)))
