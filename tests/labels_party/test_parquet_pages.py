"""The page-header walk (labels_party/parquet_pages.py) against files pyarrow writes: every codec, both data page
versions, dictionary pages, statistics, several row groups and small pages — its value counts are the footer's and
its uncompressed bytes the footer's less the headers; a damaged header is a 400, too many pages a 413."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from labels_party import parquet_pages
from shared.errors import LabelDPError


def _written(compression: str, page_version: str, statistics: bool) -> bytes:
    rng = np.random.default_rng(0)
    n = 30_000
    table = pa.table({"example_id": [f"u{i}" for i in range(n)], "label": rng.integers(0, 5, n),
                      "x": rng.normal(size=n), "s": ["a" * (i % 7) if i % 3 else None for i in range(n)]})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression=compression, data_page_version=page_version,
                   write_statistics=statistics, row_group_size=12_000, data_page_size=4096)
    return buffer.getvalue()


def _chunks(data: bytes):
    metadata = pq.ParquetFile(pa.BufferReader(data)).metadata
    for group in range(metadata.num_row_groups):
        for column in range(metadata.num_columns):
            chunk = metadata.row_group(group).column(column)
            start = chunk.data_page_offset
            if chunk.has_dictionary_page and 0 < (chunk.dictionary_page_offset or 0) < start:
                start = chunk.dictionary_page_offset
            yield chunk, start


@pytest.mark.parametrize("compression", ["none", "snappy", "zstd", "gzip", "lz4", "brotli"])
@pytest.mark.parametrize("page_version", ["1.0", "2.0"])
@pytest.mark.parametrize("statistics", [True, False])
def test_the_walk_agrees_with_honest_footers(compression, page_version, statistics):
    data = _written(compression, page_version, statistics)
    handle, pages_seen = pa.BufferReader(data), 0
    for chunk, start in _chunks(data):
        budget = [parquet_pages.MAX_PAGES]
        pages = parquet_pages.chunk_pages(handle, start, chunk.total_compressed_size, len(data), budget)
        pages_seen += parquet_pages.MAX_PAGES - budget[0]
        assert pages.values == chunk.num_values
        # the footer's uncompressed size counts each page's header too (with statistics, up to ~100 bytes a page)
        headers = chunk.total_uncompressed_size - pages.uncompressed
        assert 0 < headers <= 128 * (parquet_pages.MAX_PAGES - budget[0]), (headers, chunk)
    assert pages_seen > 30  # small pages: several per chunk


def test_a_damaged_header_is_a_400_and_too_many_pages_a_413():
    data = bytearray(_written("zstd", "1.0", True))
    chunk, start = next(_chunks(bytes(data)))
    data[start] = 0x0D  # field 1 with an unknown Thrift type
    with pytest.raises(LabelDPError) as refused:
        parquet_pages.chunk_pages(pa.BufferReader(bytes(data)), start, chunk.total_compressed_size, len(data),
                                  [parquet_pages.MAX_PAGES])
    assert refused.value.code == "malformed_file"
    honest = _written("zstd", "1.0", True)
    with pytest.raises(LabelDPError) as refused:
        parquet_pages.chunk_pages(pa.BufferReader(honest), start, chunk.total_compressed_size, len(honest), [2])
    assert refused.value.code == "body_too_large"
