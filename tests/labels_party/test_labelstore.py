"""The out-of-core label store: uploads become Parquet row groups with stable registry indices (DuckDB joins a
re-upload against the registry), and two uploads of the same version never share a file."""

from __future__ import annotations

import contextlib
import hashlib
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from labels_party.store import labelstore
from labels_party.store.storage import DataStore
from shared.domains import domain_from_spec
from shared.errors import LabelDPError

DOMAIN = domain_from_spec({"kind": "integer", "min": 0, "max": 9})


def _csv(path, ids):
    path.write_text("example_id,label\n" + "".join(f"{i},{int(i[1:]) % 10}\n" for i in ids))
    return path


def test_a_re_upload_keeps_known_indices_and_numbers_new_ids(tmp_path):
    store = DataStore(tmp_path / "data")
    first = labelstore.ingest(store, "d", 1, _csv(tmp_path / "a.csv", [f"e{i}" for i in range(1000)]), "csv",
                              DOMAIN, None, [], 0)
    assert (first.new_examples, first.registry_start, first.registry_end) == (1000, 0, 1000)
    parts = [labelstore.RegistryPart(first.file, 0, 1000)]
    ids = [f"e{i}" for i in range(1500, 500, -1)]  # e1500..e501: 499 known, 501 new, in reverse order
    second = labelstore.ingest(store, "d", 2, _csv(tmp_path / "b.csv", ids), "csv", DOMAIN, None, parts, 1000)
    assert (second.num_examples, second.new_examples, second.registry_end) == (1000, 501, 1501)
    table = pq.read_table(store.path(second.file))
    index, names = table.column("registry_index").to_numpy(), table.column("example_id").to_pylist()
    assert np.all(np.diff(index) > 0)  # sorted by registry index
    known = {name: i for name, i in zip(names, index, strict=True) if int(name[1:]) < 1000}
    assert known == {f"e{i}": i for i in range(501, 1000)}  # known ids kept their indices
    new = {name: i for name, i in zip(names, index, strict=True) if int(name[1:]) >= 1000}
    assert new == {f"e{1500 - k}": 1000 + k for k in range(501)}  # new ids numbered in upload order
    assert not store.path(second.coverage.file).exists()  # pending until its version commits (keep)
    labelstore.keep(store, second.coverage)
    coverage = labelstore.read_coverage(store, second.coverage.file, second.coverage.sha256, second.coverage.size)
    assert coverage.slice(0, coverage.size).tolist() == index.tolist()


def test_concurrent_uploads_of_one_version_do_not_share_a_file(tmp_path):
    store = DataStore(tmp_path / "data")
    body = _csv(tmp_path / "a.csv", ["e1", "e2"])
    one = labelstore.ingest(store, "d", 1, body, "csv", DOMAIN, None, [], 0)
    two = labelstore.ingest(store, "d", 1, body, "csv", DOMAIN, None, [], 0)
    assert one.file != two.file
    store.remove(two.file)  # the loser of the commit removes its own file only
    assert pq.read_table(store.path(one.file)).num_rows == 2


def test_duplicates_are_found_out_of_core_and_leave_nothing(tmp_path):
    store = DataStore(tmp_path / "data")
    with pytest.raises(LabelDPError) as refused:
        labelstore.ingest(store, "d", 1, _csv(tmp_path / "a.csv", ["e1", "e2", "e1"]), "csv", DOMAIN, None, [], 0)
    assert refused.value.code == "duplicate_example_id" and "e1" in str(refused.value)
    leftovers = [p for p in (tmp_path / "data").rglob("*") if p.is_file()]
    assert leftovers == []


def _hex_ids(start: int, stop: int) -> pa.Array:
    """64-character ids (the length that broke the registry join at 4·10⁶ rows: issue 28, item 5)."""
    return pa.array([hashlib.sha256(b"%d" % i).hexdigest() for i in range(start, stop)])


def _parquet_body(path, start, stop):
    pq.write_table(pa.table({"example_id": _hex_ids(start, stop), "label": np.arange(start, stop) % 10.0}), path)
    return path


def _spilled_bytes(data_dir, stop: threading.Event, seen: list[int]) -> None:
    """The largest size DuckDB's spill directories under ``data_dir/tmp`` reached (polled)."""
    while not stop.wait(0.002):
        total = 0
        for spill in (data_dir / "tmp").glob("duckdb-*"):
            for file in spill.rglob("*"):
                with contextlib.suppress(OSError):
                    total += file.stat().st_size
        seen[0] = max(seen[0], total)


def test_a_re_upload_larger_than_the_memory_limit_spills_and_stays_correct(tmp_path):
    """10⁶ 64-character ids on top of 10⁶ (half known) with DuckDB held to 64 MB: the duplicates check, the join
    and the sort spill to the data directory (observed there) and the version is still exact. ~15 s."""
    n = 1_000_000
    store = DataStore(tmp_path / "data")
    first = labelstore.ingest(store, "d", 1, _parquet_body(tmp_path / "a.parquet", 0, n), "parquet", DOMAIN, None,
                              [], 0, memory_mb=64)
    stop, seen = threading.Event(), [0]
    watcher = threading.Thread(target=_spilled_bytes, args=(tmp_path / "data", stop, seen))
    watcher.start()
    try:
        second = labelstore.ingest(store, "d", 2, _parquet_body(tmp_path / "b.parquet", n // 2, n + n // 2),
                                   "parquet", DOMAIN, None, [labelstore.RegistryPart(first.file, 0, n)], n,
                                   memory_mb=64)
    finally:
        stop.set()
        watcher.join()
    assert seen[0] > 64 << 20  # more than the limit went to disk
    assert (second.num_examples, second.new_examples, second.registry_end) == (n, n // 2, n + n // 2)
    table = pq.read_table(store.path(second.file))
    index = table.column("registry_index").to_numpy()
    assert np.array_equal(index, np.arange(n // 2, n + n // 2))  # known ids kept theirs; new ones in upload order
    assert table.column("example_id").to_pylist()[::99_999] == _hex_ids(n // 2, n + n // 2).to_pylist()[::99_999]
    assert np.array_equal(table.column("label").to_numpy(), np.arange(n // 2, n + n // 2) % 10.0)
    sizes = [pq.ParquetFile(store.path(second.file)).metadata.row_group(i).total_byte_size
             for i in range(pq.ParquetFile(store.path(second.file)).metadata.num_row_groups)]
    assert max(sizes) <= 2 * labelstore.ROW_GROUP_BYTES  # DuckDB reads a whole column chunk per thread
    assert not list((tmp_path / "data" / "tmp").glob("duckdb-*"))  # spill directories removed
