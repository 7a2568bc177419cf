"""How Parquet bodies' strings are read (labels_party.store.uploads.parquet_batches): as dictionaries where a row could
otherwise copy a dictionary entry, as strings where Arrow would otherwise build one dictionary of a whole row group
(an honest upload of 2·10⁶ unique ids peaked at +334 MB in Arrow's dictionary builder — issue 40's tenth review)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from labels_party.store import labelstore, uploads
from shared import parquet_pages
from shared.errors import LabelDPError

ROOT = Path(__file__).resolve().parents[2]


def _parquet(table: pa.Table, **options) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer, **options)
    return buffer.getvalue()


def _batches(data: bytes, columns=("example_id", "label"), batch_rows: int = 1 << 16) -> list[pa.RecordBatch]:
    handle = pa.BufferReader(data)
    metadata = uploads.parquet_metadata(handle)
    size = uploads.parquet_decoded(metadata, list(columns), handle)
    return list(uploads.parquet_batches(handle, metadata, size, list(columns), batch_rows))


def _id_chunk(data: bytes, group: int) -> parquet_pages.ChunkPages:
    handle = pa.BufferReader(data)
    metadata = uploads.parquet_metadata(handle)
    return uploads.parquet_decoded(metadata, ["example_id", "label"], handle).text_chunks[(group, "example_id")]


UNIQUE = pa.table({"example_id": [f"user-{i:07d}" for i in range(20_000)], "label": [1.0] * 20_000})
REPEATED = pa.table({"example_id": [f"user-{i % 10}" for i in range(20_000)], "label": [1.0] * 20_000})


@pytest.mark.parametrize("page_version", ["1.0", "2.0"])
def test_the_walk_tells_a_dictionary_from_its_plain_fallback(page_version):
    """Unique ids overflow a small dictionary page: dictionary-encoded pages first, then plain ones (what pyarrow,
    parquet-mr and DuckDB do); repeated ids stay dictionary-encoded; without a dictionary every page is plain."""
    options = {"data_page_version": page_version, "data_page_size": 4096}
    fallback = _id_chunk(_parquet(UNIQUE, dictionary_pagesize_limit=4096, **options), 0)
    assert fallback.dictionary > 0 and fallback.dictionary_first and 0 < fallback.plain_values < 20_000
    assert fallback.values == 20_000
    repeated = _id_chunk(_parquet(REPEATED, **options), 0)
    assert repeated.dictionary > 0 and repeated.dictionary_first and repeated.plain_values == 0
    plain = _id_chunk(_parquet(UNIQUE, use_dictionary=False, **options), 0)
    assert plain.dictionary == 0 and not plain.dictionary_first and plain.plain_values == 20_000


def test_each_row_group_is_read_as_its_pages_allow():
    """Row group 0 falls back to plain pages (read as strings), row group 1 is wholly dictionary-encoded (read as a
    dictionary); the rows are the table's, in order."""
    table = pa.concat_tables([UNIQUE, REPEATED])
    data = _parquet(table, row_group_size=20_000, dictionary_pagesize_limit=4096, data_page_size=4096)
    batches = _batches(data, batch_rows=5_000)
    kinds = [pa.types.is_dictionary(b.column(0).type) for b in batches]
    assert kinds == [False] * 4 + [True] * 4
    ids = pa.chunked_array([pc.cast(b.column(0), pa.string()) for b in batches])
    assert ids.to_pylist() == table.column("example_id").to_pylist()


def test_an_entry_named_by_many_rows_is_copied_at_most_a_batch_bound_at_a_time():
    """A 1 MiB id named by 300 dictionary-encoded rows, then unique ids past the dictionary page's limit: read as
    strings, a batch holds at most PLAIN_BATCH_BYTES of them — and the upload counts what they decode to and is
    refused (413) long before 300 MiB."""
    long_id = "x" * (1 << 20)
    table = pa.table({"example_id": [long_id] * 300 + [f"u{i}" for i in range(5_000)], "label": [1.0] * 5_300})
    data = _parquet(table, dictionary_pagesize_limit=(1 << 20) + 4096, data_page_size=4096)
    pages = _id_chunk(data, 0)
    assert pages.dictionary_first and pages.plain_values > 0
    batches = _batches(data)
    assert sum(b.num_rows for b in batches) == 5_300
    assert max(uploads.string_bytes(b.column(0)) for b in batches) <= uploads.PLAIN_BATCH_BYTES
    assert len(data) < 1 << 20
    with pytest.raises(LabelDPError) as refused:
        for _ in labelstore._upload_parquet(pa.BufferReader(data)):
            pass
    assert refused.value.code == "body_too_large"


_READ = """
import sys, pyarrow as pa
from labels_party.store import labelstore
with pa.OSFile(sys.argv[1]) as handle:
    rows = sum(batch.num_rows for batch in labelstore._upload_parquet(handle))
print(rows, pa.default_memory_pool().max_memory())
"""


def test_an_honest_upload_of_unique_ids_is_read_without_a_dictionary_of_the_row_group(tmp_path):
    """10⁶ unique ids in one row group, as pyarrow writes them: Arrow's memory peaked at 99 MB when they were read
    as a dictionary (its builder holds every id of the row group), 34 MB read as strings."""
    body = tmp_path / "labels.parquet"
    n = 1_000_000
    pq.write_table(pa.table({"example_id": [f"user-{i:09d}" for i in range(n)], "label": [1.0] * n}), body)
    done = subprocess.run([sys.executable, "-c", _READ, str(body)], capture_output=True, text=True, cwd=ROOT,
                          check=True)
    rows, peak = map(int, done.stdout.split())
    assert rows == n and peak < 48 << 20, peak


def test_a_chunk_of_plain_pages_only_is_read_in_batches_bounded_by_its_pages():
    """The review of the twelfth round's fixes: a chunk without a dictionary page was read 2¹⁶ rows a batch
    whatever its strings' length (65,536 ids of 4 KB: one 256 MB batch). A batch of R rows spans at most R / fewest
    + 1 plain pages, each at most the largest: R is chosen so that they hold at most PLAIN_BATCH_BYTES."""
    table = pa.table({"example_id": [("x" * 16_000) + str(i) for i in range(3_000)], "label": [1.0] * 3_000})
    data = _parquet(table, use_dictionary=False, compression="zstd", data_page_size=4096)
    pages = _id_chunk(data, 0)
    assert pages.dictionary == 0 and pages.largest_plain_page > 1 << 20  # pyarrow's pages: 1,024 values each
    batches = _batches(data)
    assert sum(b.num_rows for b in batches) == 3_000 and len(batches) > 3  # 48 MB: one batch before
    assert max(uploads.string_bytes(b.column(0)) for b in batches) <= uploads.PLAIN_BATCH_BYTES


def _moved_first_data_page_last(data: bytes) -> bytes:
    """``data`` with its id chunk's first data page (dictionary-encoded) moved after its plain ones."""
    handle = pa.BufferReader(data)
    chunk = pq.ParquetFile(handle).metadata.row_group(0).column(0)
    start, end = chunk.dictionary_page_offset, chunk.dictionary_page_offset + chunk.total_compressed_size
    spans, position = [], start
    while position < end:
        reader = parquet_pages._Reader(pa.BufferReader(data), position, len(data), parquet_pages.WalkBudget(1 << 30,
                                                                                                           1 << 40))
        found = parquet_pages._struct(reader, 0, {3: parquet_pages._I32})
        spans.append((position, reader.position + found[3]))
        position = spans[-1][1]
    dictionary, first, rest = spans[0], spans[1], spans[2:]
    moved = data[slice(*dictionary)] + b"".join(data[slice(*s)] for s in rest) + data[slice(*first)]
    return data[:start] + moved + data[end:]


def test_a_dictionary_encoded_page_after_plain_ones_is_refused():
    """No writer falls back from plain pages to dictionary-encoded ones; a body that does had its row group read
    as one growing dictionary (the review: +340 MB for 3.1 MB). Refused before its strings are read."""
    data = _parquet(UNIQUE, dictionary_pagesize_limit=4096, data_page_size=4096, compression="zstd")
    crafted = _moved_first_data_page_last(data)
    assert pq.read_table(pa.BufferReader(crafted)).column(0).to_pylist() != []  # Arrow still reads it
    pages = _id_chunk(crafted, 0)
    assert pages.dictionary_after_plain and not pages.dictionary_first
    with pytest.raises(LabelDPError) as refused:
        _batches(crafted)
    assert refused.value.code == "malformed_file"


def test_small_row_groups_are_staged_together(tmp_path):
    """The review: 3,300 row groups of 16 rows (989 KB) took 2.5 s of CPU, each staged as a row group of its own
    for DuckDB to read; batches are now written together, up to 2¹⁶ rows."""
    from shared.domains import domain_from_spec, domain_spec
    body = tmp_path / "labels.parquet"
    pq.write_table(pa.table({"example_id": [f"u{i}" for i in range(1_600)], "label": [1.0] * 1_600}), body,
                   row_group_size=16)
    assert pq.ParquetFile(body).metadata.num_row_groups == 100
    rows, _ = labelstore._parse_to(body, "parquet", domain_from_spec(domain_spec("integer", low=0, high=5)), None,
                                   tmp_path / "staged.parquet")
    staged = pq.ParquetFile(tmp_path / "staged.parquet")
    assert rows == 1_600 and staged.metadata.num_rows == 1_600 and staged.metadata.num_row_groups == 1


def test_a_body_of_many_tiny_row_groups_is_refused_before_they_are_read(tmp_path):
    """The seventeenth review: 5,300 row groups in 994 KB, 200 after 2.5 s of CPU (each row group's pages walked and
    read). A body holds at most 100 row groups and one more per 16 KiB: 400 from its footer."""
    body = tmp_path / "labels.parquet"
    pq.write_table(pa.table({"example_id": [f"u{i}" for i in range(16_000)], "label": [1.0] * 16_000}), body,
                   row_group_size=16)
    size = body.stat().st_size
    assert pq.ParquetFile(body).metadata.num_row_groups == 1_000 > 100 + size // (16 << 10)
    with pa.OSFile(str(body)) as handle, pytest.raises(LabelDPError) as refused:
        uploads.parquet_metadata(handle)
    assert refused.value.code == "malformed_file" and "row groups" in str(refused.value)
    pq.write_table(pa.table({"example_id": [f"u{i}" for i in range(16_000)], "label": [1.0] * 16_000}), body)
    with pa.OSFile(str(body)) as handle:
        assert uploads.parquet_metadata(handle).num_rows == 16_000


@pytest.mark.parametrize("encoding", ["DELTA_BYTE_ARRAY", "DELTA_LENGTH_BYTE_ARRAY"])
def test_strings_in_a_delta_encoding_are_refused(encoding):
    """The fourteenth review: DELTA_BYTE_ARRAY pages store each value as a prefix of the one before plus a suffix,
    so their bytes do not bound their strings (4,000 ids of 100 KB sharing prefixes: 140 KB, +974 MB before the
    413). The fifteenth: DELTA_LENGTH_BYTE_ARRAY's lengths are delta-packed, so 247 bytes stated 2.5·10⁸ empty
    strings whose lengths Arrow decoded (+954 MB). Strings must be plain or dictionary-encoded: 400 from the page
    headers, and the same strings so written are read."""
    ids = [("p" * 2000) + f"{i:06d}" for i in range(200)]
    delta = _parquet(pa.table({"example_id": ids, "label": [1.0] * 200}), use_dictionary=False,
                     column_encoding={"example_id": encoding})
    with pytest.raises(LabelDPError) as refused:
        _batches(delta)
    assert refused.value.code == "malformed_file" and encoding in str(refused.value)
    plain = _parquet(pa.table({"example_id": ids, "label": [1.0] * 200}), use_dictionary=False)
    assert sum(b.num_rows for b in _batches(plain)) == 200


def test_a_wholly_dictionary_encoded_chunk_is_read_in_batches_its_longest_entry_bounds():
    """The seventeenth review: 60 rows naming one 8 MB id, wholly dictionary-encoded, were one batch, whose strings
    staging made (480 MB). A batch now holds at most PLAIN_BATCH_BYTES of the rows' entries."""
    long_id = "x" * (1 << 20)
    data = _parquet(pa.table({"example_id": [long_id] * 300, "label": [1.0] * 300}),
                    dictionary_pagesize_limit=4 << 20)
    pages = _id_chunk(data, 0)
    assert pages.dictionary and not pages.plain_values
    batches = _batches(data)
    assert sum(b.num_rows for b in batches) == 300
    assert max(b.num_rows for b in batches) <= uploads.PLAIN_BATCH_BYTES // ((1 << 20) + 16)


def test_ids_of_arrows_dictionary_type_not_wholly_dictionary_encoded_are_refused():
    """The seventeenth review: ids stored with Arrow's dictionary type (a pandas category) and fallen back to plain
    pages were read as one dictionary of the row group (+1,018 MB for 8·10⁶ ids). Refused, with how to write them;
    wholly dictionary-encoded ones are read."""
    ids = pa.array([f"user-{i:07d}" for i in range(20_000)]).dictionary_encode()
    fallen = _parquet(pa.table({"example_id": ids, "label": [1.0] * 20_000}), use_dictionary=False)
    with pytest.raises(LabelDPError) as refused:
        _batches(fallen)
    assert refused.value.code == "malformed_file" and "dictionary type" in str(refused.value)
    whole = _parquet(pa.table({"example_id": ids, "label": [1.0] * 20_000}))
    assert sum(b.num_rows for b in _batches(whole)) == 20_000


def test_an_example_id_is_at_most_4096_bytes(tmp_path):
    """An id is an identifier: one of 8 MB named by 60 rows passed every decode bound (+1,001 MB, the seventeenth
    review). Over MAX_EXAMPLE_ID_BYTES the upload is a 400 at its first batch."""
    from shared.domains import domain_from_spec, domain_spec

    body = tmp_path / "labels.parquet"
    pq.write_table(pa.table({"example_id": ["a", "b" * (labelstore.MAX_EXAMPLE_ID_BYTES + 1)], "label": [1.0, 2.0]}),
                   body)
    with pytest.raises(LabelDPError) as refused:
        labelstore._parse_to(body, "parquet", domain_from_spec(domain_spec("integer", low=0, high=5)), None,
                             tmp_path / "staged.parquet")
    assert refused.value.code == "malformed_file" and "longer than 4,096 bytes" in str(refused.value)


def test_a_csv_header_past_its_bound_is_refused_before_it_is_parsed(tmp_path):
    """The eighteenth review: a group body's 16 MB header of 5.3·10⁶ short names was parsed whole by Python's csv
    module (+424 MB). A header is at most MAX_HEADER_BYTES (2 MiB: 100,000 prior columns take ~690 KB)."""
    wide = b"example_id" + b",ab" * (uploads.MAX_HEADER_BYTES // 3 + 1) + b"\ne0,1\n"
    with pytest.raises(LabelDPError) as refused:
        uploads._csv_header(io.BytesIO(wide))
    assert refused.value.code == "malformed_file"
    priors = b"example_id," + b",".join(f"p_{k}".encode() for k in range(100_000)) + b"\ne0\n"
    assert len(uploads._csv_header(io.BytesIO(priors))) == 100_001
