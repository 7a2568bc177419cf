"""privatize: a killed and retried task publishes exactly what an undisturbed run publishes, the release secret
decides the noise, ids of either type pass through as strings, and mechanisms or labels the job cannot release are
refused with their codes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from labels_party.core.registry import MechanismOptions, build_mechanism
from labels_party.spark.jobs import label_histogram, privatize
from shared.domains import Classes, integer_range
from shared.errors import LabelDPError
from tests.labels_party.spark.samplers import FailsOnceAfterTheFirstBatch, SetsInTasksOnly
from tests.labels_party.spark.sources import read_all, read_parts, write_source

DOMAIN = integer_range(1, 10)
SECRET = bytes(range(32))
ROWS = 200_000  # two files of 100,000 rows: partition 0 holds two Arrow batches of 65,536 rows and a part of one


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    labels = np.random.default_rng(11).integers(1, 11, size=ROWS).astype(np.float64)
    return write_source(tmp_path_factory.mktemp("source"), np.arange(ROWS), labels, files=2), labels


@pytest.fixture(scope="module")
def mechanism(source):
    prior = np.bincount(source[1].astype(int), minlength=11)[1:]
    return build_mechanism("opt-unbiased", DOMAIN, 1.0, prior, MechanismOptions(mesh=20))


def test_a_killed_and_retried_task_publishes_the_same_bytes(spark, tmp_path, source, mechanism):
    """Run A undisturbed; run B with partition 0's first attempt killed after its first batch was written. B's
    retry must redraw exactly A's noise: the same part files, row for row — and, since Spark's Parquet writer
    embeds nothing run-dependent (no time, no job id inside the files), byte for byte."""
    path, _labels = source
    first = privatize(spark, path, str(tmp_path / "a"), mechanism, SECRET, support_values=DOMAIN.values)
    markers = tmp_path / "markers"
    markers.mkdir()
    flaky = FailsOnceAfterTheFirstBatch(mechanism, markers)
    second = privatize(spark, path, str(tmp_path / "b"), flaky, SECRET, support_values=DOMAIN.values)
    ran = {name.name for name in markers.iterdir()}
    assert {"0-0-0", "0-0-1", "0-1-0", "0-1-1"} <= ran  # attempt 0 sampled one batch then died; attempt 1 ran
    assert not any(name.startswith("0-0-2") for name in ran) and not any(name.startswith("1-1") for name in ran)
    assert first.partitions == second.partitions == 2 and first.rows_written == second.rows_written == ROWS
    parts_a, parts_b = read_parts(first.output), read_parts(second.output)
    assert len(parts_a) == len(parts_b) == 2
    for table_a, table_b in zip(parts_a, parts_b, strict=True):
        assert table_a.num_rows > 65_536 and table_a.equals(table_b)
    files_a = sorted(Path(first.output).glob("part-*.parquet"))
    files_b = sorted(Path(second.output).glob("part-*.parquet"))
    for file_a, file_b in zip(files_a, files_b, strict=True):
        assert file_a.name[:10] == file_b.name[:10] and file_a.read_bytes() == file_b.read_bytes()


def test_the_secret_decides_the_noise(spark, tmp_path, source, mechanism):
    path, labels = source
    runs = {name: privatize(spark, path, str(tmp_path / name), mechanism, secret, support_values=DOMAIN.values)
            for name, secret in [("a", SECRET), ("again", SECRET), ("other", bytes(range(1, 33)))]}
    released = {name: read_all(run.output) for name, run in runs.items()}
    assert released["a"].equals(released["again"])
    assert released["a"].column("example_id").equals(released["other"].column("example_id"))
    a, other = (released[name].column("label").to_numpy() for name in ("a", "other"))
    assert np.mean(a != other) > 0.5  # independent draws mostly differ (this mechanism keeps a label w.p. < 0.3)
    assert not np.array_equal(a, labels)


@pytest.mark.parametrize("kind", ["int64", "string"])
def test_integer_and_string_ids_are_released_as_strings_in_order(spark, tmp_path, kind):
    labels = np.arange(3000) % 10 + 1.0
    ids = np.arange(3000) * 7 if kind == "int64" else [f"id-{i:05d}" for i in range(3000)]
    path = write_source(tmp_path / "source", ids, labels, files=3)
    assert label_histogram(spark, path, DOMAIN.values).num_examples == 3000
    mechanism = build_mechanism("rr", DOMAIN, 2.0)
    result = privatize(spark, path, str(tmp_path / "out"), mechanism, SECRET, support_values=DOMAIN.values)
    released = read_all(result.output)
    assert str(released.schema.field("example_id").type) in ("string", "large_string")
    assert str(released.schema.field("label").type) == "double" and result.rows_written == 3000
    assert sorted(released.column("example_id").to_pylist()) == sorted(str(i) for i in ids)
    position = {str(example): index for index, example in enumerate(ids)}
    for part in read_parts(result.output):  # each partition is a run of the source's rows, in their order
        assert np.all(np.diff([position[example] for example in part.column("example_id").to_pylist()]) == 1)
    assert set(released.column("label").to_numpy()) <= set(DOMAIN.values)


def test_label_set_mechanisms_are_refused_before_the_job(spark, tmp_path):
    path = write_source(tmp_path / "source", np.arange(10), np.arange(10) % 3 + 0.0, files=1)
    subset = build_mechanism("subset", Classes(3), 1.0)
    with pytest.raises(LabelDPError, match="one number per label") as refused:
        privatize(spark, path, str(tmp_path / "out"), subset, SECRET, support_values=np.arange(3.0))
    assert refused.value.code == "mechanism_not_supported_on_spark" and not (tmp_path / "out").exists()


def test_the_workers_refuse_what_the_driver_could_not_see(spark, tmp_path):
    """A sampler that releases sets only inside tasks, and a label outside the support the job was given (a source
    that changed after its histogram): both refused in the workers, raised on the driver with their codes."""
    path = write_source(tmp_path / "source", np.arange(100), np.arange(100) % 10 + 1.0, files=1)
    rr = build_mechanism("rr", DOMAIN, 1.0)
    with pytest.raises(LabelDPError, match="one number per label") as refused:
        privatize(spark, path, str(tmp_path / "sets"), SetsInTasksOnly(rr), SECRET, support_values=DOMAIN.values)
    assert refused.value.code == "mechanism_not_supported_on_spark"
    with pytest.raises(LabelDPError, match="outside the domain") as refused:
        privatize(spark, path, str(tmp_path / "outside"), rr, SECRET, support_values=np.arange(1.0, 10.0))
    assert refused.value.code == "label_out_of_domain"
    with pytest.raises(LabelDPError, match="overwrite their source"):
        privatize(spark, path, path + "/", rr, SECRET, support_values=DOMAIN.values)
