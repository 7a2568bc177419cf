"""label_histogram: exact counts of every support value, and each refusal with its code."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from labels_party.spark.jobs import label_histogram
from shared.errors import LabelDPError
from tests.labels_party.spark.sources import write_source

SUPPORT = np.arange(1.0, 11.0)  # an integer domain 1..10


def test_counts_are_exact(spark, tmp_path):
    labels = np.random.default_rng(5).integers(1, 11, size=100_000)
    labels[:3] = 10  # the largest value is present; 7 absent below
    labels[labels == 7] = 6
    source = write_source(tmp_path / "labels", np.arange(labels.size), labels.astype(np.int32), files=3)
    result = label_histogram(spark, source, SUPPORT)
    np.testing.assert_array_equal(result.counts, np.bincount(labels, minlength=11)[1:])
    assert result.counts[6] == 0 and result.num_examples == labels.size and result.counts.dtype == np.int64
    np.testing.assert_array_equal(result.support_values, SUPPORT)


def test_classes_with_string_ids_and_fractional_support(spark, tmp_path):
    classes = np.random.default_rng(6).integers(0, 4, size=5000).astype(np.float64)
    source = write_source(tmp_path / "classes", [f"ex-{i}" for i in range(classes.size)], classes, files=2)
    counts = label_histogram(spark, source, np.arange(4.0)).counts
    np.testing.assert_array_equal(counts, np.bincount(classes.astype(int), minlength=4))
    fractions = np.array([-1.5, 0.0, 1.75])
    labels = np.tile([-1.5, -0.0, 1.75, -1.5, 0.0, 1.75], 50)  # -0.0 is the label 0.0
    source = write_source(tmp_path / "fractions", np.arange(labels.size), labels, files=1)
    np.testing.assert_array_equal(label_histogram(spark, source, fractions).counts, [100, 100, 100])


def _table(ids, labels, types=(None, None)):
    return pa.array(ids, type=types[0]), pa.array(labels, type=types[1])


REFUSALS = {
    "no rows": ("empty_labels", "holds no labels", _table([], [], (pa.string(), pa.float64()))),
    "a null example_id": ("malformed_file", "1 example_ids are missing", _table(["a", None, "c"], [1.0, 2.0, 3.0])),
    "an empty example_id": ("malformed_file", "missing or empty", _table(["a", "", "c"], [1.0, 2.0, 3.0])),
    "a null label": ("malformed_file", "1 labels are missing", _table(["a", "b", "c"], [1.0, None, 3.0])),
    "labels outside the support": ("label_out_of_domain", "3 of 5 labels are not in the domain's 10 values",
                                   _table(list("abcde"), [1.0, 11.0, 2.5, float("nan"), 10.0])),
    "a repeated example_id": ("duplicate_example_id", "2 rows repeat an example_id",
                              _table(["a", "b", "a", "c", "a"], [1.0, 2.0, 3.0, 4.0, 5.0])),
    "a string label": ("malformed_file", "label must be a numeric column", _table(["a"], ["1"])),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refusals(spark, tmp_path, case):
    code, message, (ids, labels) = REFUSALS[case]
    source = write_source(tmp_path / "labels", ids, labels, files=1)
    with pytest.raises(LabelDPError, match=message) as refused:
        label_histogram(spark, source, SUPPORT)
    assert refused.value.code == code


def test_missing_columns_and_sources_are_refused(spark, tmp_path):
    (tmp_path / "nolabel").mkdir()
    pq.write_table(pa.table({"example_id": ["a"], "y": [1.0]}), tmp_path / "nolabel" / "part.parquet")
    with pytest.raises(LabelDPError, match="lacks label") as refused:
        label_histogram(spark, str(tmp_path / "nolabel"), SUPPORT)
    assert refused.value.code == "malformed_file"
    with pytest.raises(LabelDPError, match="cannot read a Parquet dataset") as refused:
        label_histogram(spark, str(tmp_path / "absent"), SUPPORT)
    assert refused.value.code == "malformed_file"
    with pytest.raises(LabelDPError) as refused:
        label_histogram(spark, str(tmp_path / "nolabel"), np.array([1.0, 1.0]))
    assert refused.value.code == "invalid_domain"
