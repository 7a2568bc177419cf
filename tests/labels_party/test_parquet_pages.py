"""The page-header walk (shared/parquet_pages.py) against files pyarrow writes: every codec, both data page
versions, dictionary pages, statistics, several row groups and small pages — its value counts are the footer's and
its uncompressed bytes the footer's less the headers; a damaged header is a 400, too many pages a 413."""

from __future__ import annotations

import io
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shared import parquet_pages
from shared.errors import LabelDPError
from tests.support.parquet_craft import (
    I32,
    I64,
    STRUCT,
    Column,
    data_page,
    dictionary_page,
    first_entry_indices,
    parquet_file,
    plain_doubles,
    plain_strings,
    thrift_struct,
    varint,
)


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
        budget = parquet_pages.WalkBudget(parquet_pages.MAX_PAGES, len(data))
        pages = parquet_pages.chunk_pages(handle, start, chunk.total_compressed_size, len(data), budget)
        pages_seen += parquet_pages.MAX_PAGES - budget.pages
        assert pages.values == chunk.num_values
        assert (pages.dictionary_values > 0) == chunk.has_dictionary_page and pages.encodings
        # the footer's uncompressed size counts each page's header too (with statistics, up to ~100 bytes a page);
        # the walk counts a page at its stored bytes when those are more (an incompressible page, or a header's lie)
        headers = chunk.total_uncompressed_size - pages.uncompressed
        assert headers <= 128 * (parquet_pages.MAX_PAGES - budget.pages), (headers, chunk)
        assert pages.uncompressed <= max(chunk.total_uncompressed_size, chunk.total_compressed_size), chunk
        if compression == "none":
            assert headers > 0
    assert pages_seen > 30  # small pages: several per chunk


def _header_at_first_page(fields: bytes) -> tuple[bytes, int, int]:
    """An honest file whose first page header is overwritten with ``fields`` (then a struct's end): the bytes, the
    chunk's start and claimed length."""
    data = bytearray(_written("zstd", "1.0", True))
    chunk, start = next(_chunks(bytes(data)))
    data[start:start + len(fields) + 1] = fields + b"\x00"
    return bytes(data), start, chunk.total_compressed_size


@pytest.mark.parametrize("fields", [
    b"\x1b" + bytes([0xff] * 8) + b"\x3f" + b"\x11",  # field 1: a map of 2^62 booleans (review: an endless loop)
    b"\x19\xf1" + bytes([0xff] * 8) + b"\x3f",  # field 1: a list of 2^62 booleans
    b"\x19\xfc" + bytes([0xff] * 8) + b"\x3f",  # field 1: a list of 2^62 structs
    b"\x18" + bytes([0xff] * 8) + b"\x3f",  # field 1: a binary of 2^62 bytes
    b"\x1c" * 40,  # structs nested 40 deep
])
def test_a_header_that_claims_more_than_its_bytes_is_a_400_at_once(fields):
    data, start, length = _header_at_first_page(fields)
    with pytest.raises(LabelDPError) as refused:
        parquet_pages.chunk_pages(pa.BufferReader(data), start, length, len(data),
                                  parquet_pages.WalkBudget(parquet_pages.MAX_PAGES, len(data)))
    assert refused.value.code == "malformed_file"


def test_chunks_that_read_one_header_again_and_again_spend_the_bodys_header_bytes():
    """The review's amplification: every chunk pointing at one large header. The header bytes a walk parses are
    bounded by the body's size."""
    data = _written("zstd", "1.0", True)
    chunk, start = next(_chunks(data))
    budget = parquet_pages.WalkBudget(parquet_pages.MAX_PAGES, len(data))
    with pytest.raises(LabelDPError) as refused:
        for _ in range(parquet_pages.MAX_PAGES):
            parquet_pages.chunk_pages(pa.BufferReader(data), start, 1, len(data), budget)
    assert refused.value.code == "body_too_large" and budget.pages > parquet_pages.MAX_PAGES - len(data)


def test_a_damaged_header_is_a_400_and_too_many_pages_a_413():
    data = bytearray(_written("zstd", "1.0", True))
    chunk, start = next(_chunks(bytes(data)))
    data[start] = 0x0D  # field 1 with an unknown Thrift type
    with pytest.raises(LabelDPError) as refused:
        parquet_pages.chunk_pages(pa.BufferReader(bytes(data)), start, chunk.total_compressed_size, len(data),
                                  parquet_pages.WalkBudget(parquet_pages.MAX_PAGES, len(data)))
    assert refused.value.code == "malformed_file"
    honest = _written("zstd", "1.0", True)
    with pytest.raises(LabelDPError) as refused:
        parquet_pages.chunk_pages(pa.BufferReader(honest), start, chunk.total_compressed_size, len(honest),
                                  parquet_pages.WalkBudget(2, len(honest)))
    assert refused.value.code == "body_too_large"


@pytest.mark.parametrize(("created_by", "refused"), [
    ("parquet-mr version 1.2.8 (build 123)", True),  # Arrow pads its chunks' ranges by up to 100 bytes
    ("parquet-mr", True),  # no version Arrow can read: treated as older
    ("PARQUET-MR version 1.0.0", True),
    ("parquet-mr version 1.2.9 (build x)", False),
    ("parquet-mr version 1.12.3 (build abc)", False),
    ("parquet-cpp-arrow version 26.0.1", False),
    (None, False),
    # the ninth review: versions Arrow reads as older than 1.2.9 (atoi: ASCII digits only, wrapping at 2³²)
    ("parquet-mr version \u0661.\u0662.\u0669", True),
    ("parquet-mr version 1.2.\u0669", True),
    ("parquet-mr version \uff11.\uff12.\uff19", True),
    ("parquet-mr version 4294967296.2.9", True),
    ("parquet-mr version 1.4294967297.9", True),
    ("parquet-mr version 1.2.4294967304", True),
    ("parquet-mr version 99999999999999999999.0.0", True),
    ("x parquet-mr version 1.12.3", True),
])
def test_files_of_writers_whose_chunks_readers_pad_are_refused(created_by, refused):
    """Issue 40's eighth review: in a parquet-mr < 1.2.9 file Arrow reads up to 100 bytes past a chunk's claimed
    range (PARQUET-816), where a 32 MiB page fits in 91 bytes of Brotli, uncounted by the walk."""
    if refused:
        with pytest.raises(LabelDPError) as error:
            parquet_pages.check_writer(created_by)
        assert error.value.code == "malformed_file"
    else:
        parquet_pages.check_writer(created_by)


def test_a_body_whose_writer_string_arrow_reads_as_old_is_refused_before_any_page():
    """The ninth review's bypass end to end: a page hidden in the 100 bytes Arrow reads past the chunk of a
    "parquet-mr 1.2.٩" file (a 32 MiB id in ~80 bytes of Brotli) — Arrow does read it; the service refuses the
    file first."""
    from labels_party.store import uploads

    hidden = data_page(plain_strings([b"a" * (32 << 20)]), 1, "brotli", level=5)
    assert len(hidden) <= 100
    first = data_page(plain_strings([b"u1"]), 1, "brotli")
    data = parquet_file([Column("example_id", "byte_array", first, 2, "brotli", extra=hidden),
                         Column("label", "double", data_page(plain_doubles([1.0, 2.0]), 2), 2)], rows=2,
                        created_by="parquet-mr version 1.2.\u0669")
    read = pq.read_table(pa.BufferReader(data), columns=["example_id"]).column(0).to_pylist()
    assert max(len(value) for value in read) == 32 << 20  # Arrow pads the chunk: the hidden page is read
    metadata = pq.ParquetFile(pa.BufferReader(data)).metadata
    with pytest.raises(LabelDPError) as refused:
        uploads.parquet_decoded(metadata, ["example_id", "label"], pa.BufferReader(data))
    assert refused.value.code == "malformed_file"


def _typed(ids: pa.Array, numbers: pa.Array) -> pa.BufferReader:
    buffer = io.BytesIO()
    pq.write_table(pa.table({"example_id": ids, "label": numbers}), buffer)
    return pa.BufferReader(buffer.getvalue())


@pytest.mark.parametrize(("ids", "numbers", "refused"), [
    (pa.array(["a", "b"]), pa.array([1.0, 2.0]), None),
    (pa.array(["a", "b"], pa.large_string()), pa.array([1, 2], pa.int8()), None),
    (pa.array([7, 8], pa.int64()), pa.array([True, False]), None),
    (pa.array(["a", "b"]).dictionary_encode(), pa.array([1, 2], pa.decimal128(5, 2)), None),
    # the tenth review: ids read whole and uncounted, or held five times what was counted
    (pa.array(["a", "b"], pa.string_view()), pa.array([1.0, 2.0]), "example_id"),
    (pa.array([b"a", b"b"], pa.binary(1)), pa.array([1.0, 2.0]), "example_id"),
    (pa.array([1, 2], pa.timestamp("s", tz="UTC")), pa.array([1.0, 2.0]), "example_id"),
    (pa.array(["a", "b"]), pa.array(["1", "2"]), "label"),
])
def test_columns_of_types_these_bodies_do_not_take_are_refused_from_the_schema(ids, numbers, refused):
    from labels_party.store import uploads

    handle = _typed(ids, numbers)
    metadata = uploads.parquet_metadata(handle)
    if refused is None:
        uploads.parquet_decoded(metadata, ["example_id", "label"], handle)
        return
    with pytest.raises(LabelDPError) as error:
        uploads.parquet_decoded(metadata, ["example_id", "label"], handle)
    assert error.value.code == "malformed_file" and repr(refused) in str(error.value)


@pytest.mark.parametrize("where", ["created_by", "name"])
def test_metadata_text_that_is_not_utf8_is_a_400(where):
    """The tenth review: a writer string or a column name that is not UTF-8 failed in Arrow as a
    UnicodeDecodeError wherever it was first read — a 500 on label uploads."""
    from labels_party.store import uploads

    name = b"lab\xffel" if where == "name" else "label"
    data = parquet_file([Column("example_id", "byte_array", data_page(plain_strings([b"u1"]), 1), 1),
                         Column(name, "double", data_page(plain_doubles([1.0]), 1), 1)], rows=1,  # type: ignore[arg-type]
                        **({"created_by": b"writer \xff\xfe"} if where == "created_by" else {}))  # type: ignore[arg-type]
    with pytest.raises(LabelDPError) as error:
        uploads.parquet_metadata(pa.BufferReader(data))
    assert error.value.code == "malformed_file" and "UTF-8" in str(error.value)


# Page headers written field by field, to state what Arrow's Thrift code and a looser walk would read differently (the
# fifteenth and sixteenth reviews)
def _i32(value: int) -> tuple[int, int]:
    return I32, value


def _data_header(values: int, encoding: int) -> bytes:
    return thrift_struct((1, *_i32(values)), (2, *_i32(encoding)), (3, *_i32(3)), (4, *_i32(3)))


def _v2_header(values: int, encoding: int) -> bytes:
    return thrift_struct((1, *_i32(values)), (2, *_i32(0)), (3, *_i32(values)), (4, *_i32(encoding)), (5, *_i32(0)),
                   (6, *_i32(0)))


def _walk(*pages: bytes, budget_pages: int = parquet_pages.MAX_PAGES) -> parquet_pages.ChunkPages:
    data = b"".join(pages)
    return parquet_pages.chunk_pages(io.BytesIO(data), 0, len(data), len(data),
                                     parquet_pages.WalkBudget(budget_pages, len(data)))


def _page(kind: int, size: int, *nested: tuple[int, int, bytes], stored: int = 0) -> bytes:
    return thrift_struct((1, *_i32(kind)), (2, *_i32(size)), (3, *_i32(stored)), *nested) + b"\x00" * stored


def test_the_page_type_says_which_header_is_the_pages():
    """A v2 data page with a v1 header beside it (PLAIN, one value) hiding its own (DELTA_BYTE_ARRAY, 4,000
    values): Arrow reads the v2 header, and so does the walk (it took +1.9 GB when it read the v1 one)."""
    v2 = _walk(_page(3, 100, (5, STRUCT, _data_header(1, 0)), (8, STRUCT, _v2_header(4000, 7))))
    assert v2.values == 4000 and v2.encodings == {7}
    v1 = _walk(_page(0, 100, (5, STRUCT, _data_header(3, 0)), (8, STRUCT, _v2_header(4000, 7))))
    assert v1.values == 3 and v1.encodings == {0}
    dictionary = _walk(_page(2, 88, (7, STRUCT, thrift_struct((1, *_i32(22_000_000)), (2, *_i32(0))))))
    assert dictionary.dictionary_values == 22_000_000 and dictionary.values == 0 and dictionary.dictionary == 88
    with pytest.raises(LabelDPError) as refused:  # Arrow would read an empty PLAIN page; no writer writes one
        _walk(_page(0, 100, (8, STRUCT, _v2_header(4000, 7))))
    assert refused.value.code == "malformed_file"


def test_fields_are_read_with_arrows_wire_types_the_last_one_counting():
    """Arrow's Thrift code skips a field of another wire type and lets a repeated one override: an i32 size then an
    i64 one is the i32 (the review hid a page's 250 MB this way), an encoding stated twice as i32 is the last."""
    lied = thrift_struct((1, *_i32(0)), (2, *_i32(250_000_000)), (2, I64, varint(2)), (3, *_i32(0)),
                   (5, STRUCT, thrift_struct((1, *_i32(10)), (2, *_i32(7)), (2, I64, varint(0)), (3, *_i32(3)),
                                       (4, *_i32(3)))))
    pages = _walk(lied)
    assert pages.uncompressed == 250_000_000 and pages.encodings == {7}
    repeated = thrift_struct((1, *_i32(0)), (2, *_i32(10)), (3, *_i32(0)), (2, *_i32(20)),
                       (5, STRUCT, _data_header(4, 0)), (5, STRUCT, thrift_struct((2, *_i32(7)))))
    pages = _walk(repeated)
    assert pages.uncompressed == 20 and pages.values == 4 and pages.encodings == {7}  # a struct merged field by field
    # an i32 is at most five varint bytes, of which the low 32 bits count (as Thrift's readVarint32)
    wide = bytes([0x82 | 0x80, 0x80, 0x80, 0x80, 0x70])  # zigzag(1) with bits above 32 set
    assert _walk(thrift_struct((1, *_i32(1)), (2, I32, wide), (3, *_i32(0)))).uncompressed == 1  # an index page
    with pytest.raises(LabelDPError) as refused:
        _walk(thrift_struct((1, *_i32(1)), (2, I32, bytes([0x80] * 5 + [0x01])), (3, *_i32(0))))
    assert refused.value.code == "malformed_file"


def test_pages_of_headers_alone_are_read_from_one_window():
    """The review's 199,000 empty index pages took 2.3 s of CPU, the file read again for each: the walk keeps its
    window, so 10,000 of them are read in a few reads of the file."""
    pages = [_page(1, 0) for _ in range(10_000)]
    data = b"".join(pages)

    class Counting(io.BytesIO):
        reads = 0

        def read(self, size=-1):
            Counting.reads += 1
            return super().read(size)

    walked = parquet_pages.chunk_pages(Counting(data), 0, len(data), len(data),
                                       parquet_pages.WalkBudget(parquet_pages.MAX_PAGES, len(data)))
    assert walked.values == 0 and Counting.reads <= len(data) // (64 << 10) + 2


@pytest.mark.parametrize("far", [65538, -65534, 2 + (1 << 32)])
def test_a_field_id_wraps_to_sixteen_bits_as_arrows_does(far):
    """The sixteenth review: Thrift's C++ reads a field id as an int16, so id 65538 is field 2 to Arrow — a decoy
    size first and the real one under the far id hid 250 MB from a walk that kept Python's integers (+960 MB)."""
    header = thrift_struct((1, *_i32(1)), (2, *_i32(1)), (far, *_i32(250_000_000)), (3, *_i32(0)))
    assert _walk(header).uncompressed == 250_000_000


def test_decimals_as_variable_length_bytes_are_refused():
    """The sixteenth review: a decimal label in BYTE_ARRAY was sized as strings but read whole, not in the bounded
    batches of strings (one 8 MB entry named by 80 rows in 633 bytes: +1,120 MB). Refused from the schema."""
    from labels_party.store import uploads

    ids = Column("example_id", "byte_array", data_page(plain_strings([b"a"]), 1), 1)
    label = Column("label", "byte_array", data_page(plain_strings([b"\x01"]), 1), 1, decimal=38)
    handle = pa.BufferReader(parquet_file([ids, label], 1))
    with pytest.raises(LabelDPError) as refused:
        uploads.parquet_decoded(uploads.parquet_metadata(handle), ["example_id", "label"], handle)
    assert refused.value.code == "malformed_file" and "decimals as variable-length bytes" in str(refused.value)


def test_a_number_dictionarys_entries_are_counted_with_their_pointers():
    """The sixteenth review: a dictionary of 3.2·10⁷ one-byte decimals in 1.3 KB was counted at twice its page and
    held about ten bytes an entry (+310 MB, stored). Each entry now counts a pointer and its value besides."""
    from labels_party.store import uploads

    entries = 100_000
    dictionary = dictionary_page(b"\x00" * (8 * entries), entries)
    label = Column("label", "int64", dictionary + data_page(first_entry_indices(1), 1, encoding=8), 1,
                   dictionary=len(dictionary))
    ids = Column("example_id", "byte_array", data_page(plain_strings([b"a"]), 1), 1)
    handle = pa.BufferReader(parquet_file([ids, label], 1))
    size = uploads.parquet_decoded(uploads.parquet_metadata(handle), ["example_id", "label"], handle)
    assert size.total >= (8 * entries) * 2 + (8 + 8) * entries  # the page, Arrow's copy, a pointer and value each


def test_a_footer_list_is_refused_past_its_limit_before_arrow_reserves_it():
    """The seventeenth review: Arrow's Thrift code reserves a list's declared length before reading an element, so
    40 bytes declaring 10⁶ row groups, each of 10⁶ chunks, took +832 MB before failing. A footer list is at most
    20,000 elements: refused at once."""
    from labels_party.store import uploads

    declared = bytes([0xF0 | STRUCT]) + varint(1_000_000)
    footer = bytes([(1 << 4) | I32]) + varint(2) + bytes([(3 << 4) | 9]) + declared + bytes([(1 << 4) | 9]) + \
        declared + b"\x00" * 8
    data = b"PAR1" + footer + len(footer).to_bytes(4, "little") + b"PAR1"
    with pytest.raises(LabelDPError) as refused:
        uploads.parquet_metadata(pa.BufferReader(data))
    assert refused.value.code == "malformed_file" and "Exceeded size limit" in str(refused.value)


def test_a_page_is_counted_at_its_stored_bytes_when_its_header_says_fewer():
    """The seventeenth review: a dictionary page stating 0 uncompressed bytes in an uncompressed chunk — Arrow reads
    its stored bytes — hid the dictionary, and its entry was copied to every row (+2,520 MB)."""
    header = thrift_struct((1, *_i32(2)), (2, *_i32(0)), (3, *_i32(5000)),
                           (7, STRUCT, thrift_struct((1, *_i32(1)), (2, *_i32(0)))))
    pages = _walk(header + b"\x00" * 5000)
    assert pages.dictionary == pages.uncompressed == 5000 and pages.dictionary_values == 1


@pytest.mark.parametrize("table", [
    pa.table({"example_id": ["a", "a"], "label": [1.0, 2.0]}).rename_columns(["example_id", "example_id"]),
    pa.table({"example_id": ["a", "b"], "label": pa.array([Decimal("1.00"), Decimal("2.00")], pa.decimal128(5, 2))}),
])
def test_duplicate_names_and_delta_numbers_are_400s(table):
    """Two columns named example_id made Schema.field raise (a 500); DELTA_BYTE_ARRAY on a fixed-length column
    decoded its streams when the page opened (242 bytes, +1,911 MB) — both refused from what the footer and page
    headers say."""
    from labels_party.store import uploads

    buffer = io.BytesIO()
    options = {} if table.num_columns == 2 and table.column_names[0] == table.column_names[1] else {
        "use_dictionary": False, "column_encoding": {"label": "DELTA_BYTE_ARRAY"}}
    pq.write_table(table, buffer, **options)
    handle = pa.BufferReader(buffer.getvalue())
    with pytest.raises(LabelDPError) as refused:
        uploads.parquet_decoded(uploads.parquet_metadata(handle), ["example_id", "label"], handle)
    assert refused.value.code == "malformed_file"
    assert ("more than one column" if "column_encoding" not in options else "byte-array delta") in str(refused.value)
