"""What a Parquet column chunk's pages decode to, read from their own headers (issue 40's sixth review).

A Parquet file's footer *claims* each column chunk's uncompressed size and value count; the reader decompresses
each page into a buffer of the size its *page header* states. A body whose footer understates the chunk (a
one-row file whose footer says 200 bytes while its one page holds a 64 MiB string compressed to 2.7 KB) passed the
footer-based check and took the server to +1 GB. The page headers are what decompression obeys, so the limits are
checked against them too, before any page is decompressed: the bytes in the chunk's range (the range the reader
reads) are walked header by header — each header is parsed, its page body skipped unread.

A page header is a Thrift struct in the compact protocol (parquet-format's ``PageHeader``): field 1 is the page
type, 2 the uncompressed page size, 3 the compressed size, and the header of the page's type (5 a data page's, 8 a
v2 data page's, 7 a dictionary page's) starts with its value count. Only those are kept, read as Arrow's Thrift
code reads them (the fifteenth review: a walk that read what Arrow skips was told other sizes and encodings than
Arrow decoded, +2 GB): a field of another wire type than the schema's is skipped, a repeated one overrides the one
before (a repeated struct field by field), an i32 is at most five varint bytes of which the low 32 bits count, a
field id is an int16 that wraps (the sixteenth review: id 65538 is Arrow's field 2), and the page type alone says
which nested header is the page's. Every other field is skipped by type. pyarrow exposes
none of this (its page reader is internal), and no maintained Python library reads page headers alone, hence this
reader.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc

from shared.errors import ErrorCode, LabelDPError

DATA_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 2, 3  # a page header's type (parquet.thrift PageType)
# Per body: a page header is at least ~6 bytes, read ~5 µs each (the fifteenth review's 199,000 empty pages took 1 s
# of CPU with the window kept); an honest body of 64 MiB in 4 KiB pages has 16,000, one of 3,300 row groups 13,200
MAX_PAGES = 50_000
# A page header (statistics included) larger than this is refused: writers keep page statistics to a few KB (Arrow
# drops a value over 4 KiB), and the walk parses ~1 µs a byte (the sixteenth review: 1 MB of empty lists, 0.6 s)
MAX_HEADER_BYTES = 256 << 10
_WINDOW = 64 << 10

# Thrift compact protocol types
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)


# Arrow reads up to 100 bytes past a column chunk's claimed range in files of parquet-mr before 1.2.9 (PARQUET-816:
# those writers left the dictionary page's header out of the chunk's sizes), so a page there would be decompressed
# uncounted (issue 40's eighth review: a 32 MiB page in 91 bytes of Brotli). Such files are refused. Arrow reads
# the version's numbers with atoi, so the ninth review's "1.2.٩" (Unicode digits, which \d matches) and
# "4294967296.2.9" (2³² wraps to 0) were old to Arrow and new to a looser check: a writer string that names
# parquet-mr must now be "parquet-mr version A.B.C…" with ASCII numbers too short to wrap, at least 1.2.9.
_NAMES_PARQUET_MR = re.compile(r"parquet[\W_]*mr", re.IGNORECASE)
_PARQUET_MR_VERSION = re.compile(r"parquet-mr version ([0-9]{1,9})\.([0-9]{1,9})\.([0-9]{1,9})(?![0-9])",
                                 re.ASCII)
FIXED_PARQUET_MR = (1, 2, 9)


def check_writer(created_by: str | None) -> None:
    """400 ``malformed_file`` for a file whose writer string names parquet-mr, unless it states plainly a version
    from 1.2.9 on (see :data:`FIXED_PARQUET_MR`)."""
    text = created_by or ""
    if _NAMES_PARQUET_MR.search(text) is None:
        return
    match = _PARQUET_MR_VERSION.match(text.strip())
    if match is None or tuple(int(part) for part in match.groups()) < FIXED_PARQUET_MR:
        raise LabelDPError("the Parquet body was written by parquet-mr before 1.2.9, whose chunk sizes readers pad "
                           "(PARQUET-816): write it again with a current writer", code=ErrorCode.MALFORMED_FILE)


DICTIONARY_ENCODINGS = (2, 8)  # a data page's PLAIN_DICTIONARY or RLE_DICTIONARY (parquet.thrift Encoding)
# The encodings whose page bytes bound what their strings decode to: PLAIN and the dictionary's indices. Not
# DELTA_BYTE_ARRAY (7: each value repeats a prefix of the one before, so 110 KB of pages decoded to 400 MB — the
# fourteenth review), nor DELTA_LENGTH_BYTE_ARRAY (6: its lengths are delta-packed, so 247 bytes stated 2.5·10⁸
# empty strings and Arrow decoded their lengths, +954 MB — the fifteenth).
BOUNDED_STRING_ENCODINGS = frozenset({0, *DICTIONARY_ENCODINGS})
# Any other column's: PLAIN, the dictionary's indices, RLE and BIT_PACKED (booleans), DELTA_BINARY_PACKED (integers,
# decoded lazily) and BYTE_STREAM_SPLIT — not the byte-array deltas, whose streams Arrow decodes when a page opens
# (the seventeenth review: DELTA_BYTE_ARRAY on a fixed-length decimal, 242 bytes, +1,911 MB)
BOUNDED_ENCODINGS = frozenset({0, 3, 4, 5, 9, *DICTIONARY_ENCODINGS})
# What Arrow holds per entry of a string dictionary page it decodes, besides the page: a 16-byte (pointer, length)
# per entry and the decoded array's 4-byte offset (the fifteenth review: 2.2·10⁷ empty strings in 3.2 KB, +505 MB)
DICTIONARY_ENTRY_BYTES = 20


@dataclass(frozen=True)
class ChunkPages:
    """What a column chunk's page headers state: their values and uncompressed bytes (dictionary page included),
    the dictionary page's uncompressed bytes on their own, the values of data pages not dictionary-encoded (a
    writer falls back to plain pages when its dictionary grows too large), and whether the first data page is
    dictionary-encoded."""

    values: int
    uncompressed: int
    dictionary: int = 0
    plain_values: int = 0
    dictionary_first: bool = False
    # the plain data pages' largest uncompressed size, and the fewest values any of them but the last holds: a
    # batch of R rows read as strings spans at most R / fewest + 1 such pages
    largest_plain_page: int = 0
    fewest_plain_values: int = 0
    dictionary_after_plain: bool = False  # a dictionary-encoded data page after a plain one (no writer does that)
    encodings: frozenset[int] = frozenset()  # the data pages' encodings
    dictionary_values: int = 0  # the entries the dictionary page states


class _Malformed(Exception):
    pass


class _Exhausted(_Malformed):
    """The body's header bytes ran out (its chunks read headers again and again), not the header's own."""


@dataclass
class WalkBudget:
    """What one body's walk may still do: pages, and header bytes parsed (an honest file's headers occupy distinct
    bytes, so at most its size — chunks that all point at one large header are not parsed again and again)."""

    pages: int
    header_bytes: int


class _Reader:
    """Forward reads from ``handle`` (a seekable binary file) starting at ``position``, through a small window,
    within :data:`MAX_HEADER_BYTES` of the start and the body's header-byte budget. Every element of every Thrift
    collection takes at least one byte, so a collection's count is bounded by the bytes left: no count makes the
    walk loop without reading."""

    def __init__(self, handle, position: int, size: int, budget: WalkBudget):
        self.handle, self.size = handle, size
        self.window, self.start = b"", position
        self.at(position, budget)

    def at(self, position: int, budget: WalkBudget) -> None:
        """Read on from ``position``: the window is kept (a page of headers alone is read from it, not again from
        the file — the fifteenth review's 199,000 empty pages took 2.3 s of CPU with a window read for each)."""
        self.position = position
        self.budgeted = position + max(0, budget.header_bytes) < min(self.size, position + MAX_HEADER_BYTES)
        self.end = min(self.size, position + MAX_HEADER_BYTES, position + max(0, budget.header_bytes))

    def left(self) -> int:
        return self.end - self.position

    def byte(self) -> int:
        offset = self.position - self.start
        if self.position >= self.end:
            raise (_Exhausted if self.budgeted else _Malformed)(
                "a page header runs past the end of the file, or is larger than any writer makes")
        if not 0 <= offset < len(self.window):
            self.handle.seek(self.position)
            self.window, self.start, offset = self.handle.read(_WINDOW), self.position, 0
            if not self.window:
                raise _Malformed("a page header runs past the end of the file")
        self.position += 1
        return self.window[offset]

    def skip(self, count: int) -> None:
        if count < 0 or count > self.left():
            raise (_Exhausted if self.budgeted and count >= 0 else _Malformed)(
                "a page header names bytes past the end of the file, or is larger than any writer makes")
        self.position += count

    def varint(self) -> int:
        value = shift = 0
        while True:
            byte = self.byte()
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise _Malformed("a varint longer than 64 bits")

    def i32(self) -> int:
        """A compact-protocol i32 as Thrift's C++ reads it: at most five varint bytes, their low 32 bits zigzag
        decoded."""
        value = shift = 0
        for _ in range(5):
            byte = self.byte()
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                value &= 0xFFFFFFFF
                return (value >> 1) ^ -(value & 1)
            shift += 7
        raise _Malformed("an i32 longer than five bytes")


def _skip(reader: _Reader, kind: int, depth: int = 0) -> None:
    if depth > 32:
        raise _Malformed("a page header nested too deep")
    if kind in (_TRUE, _FALSE, _BYTE):  # a struct's boolean field is its type alone (called with in_field)
        reader.skip(1 if kind == _BYTE else 0)
    elif kind in (_I16, _I32, _I64):
        reader.varint()
    elif kind == _DOUBLE:
        reader.skip(8)
    elif kind == _BINARY:
        reader.skip(reader.varint())
    elif kind in (_LIST, _SET):
        header = reader.byte()
        count, element = header >> 4, header & 0x0F
        if count == 15:
            count = reader.varint()
        for _ in range(_bounded(reader, count)):
            _element(reader, element, depth + 1)
    elif kind == _MAP:
        count = reader.varint()
        if count:
            types = reader.byte()
            for _ in range(_bounded(reader, count)):
                _element(reader, types >> 4, depth + 1)
                _element(reader, types & 0x0F, depth + 1)
    elif kind == _STRUCT:
        _struct(reader, depth + 1, {})
    else:
        raise _Malformed(f"unknown Thrift type {kind}")


def _int16(value: int) -> int:
    return ((value + 0x8000) & 0xFFFF) - 0x8000


def _bounded(reader: _Reader, count: int) -> int:
    if count > reader.left():  # each element takes at least a byte
        raise _Malformed("a page header's collection is longer than its bytes")
    return count


def _element(reader: _Reader, kind: int, depth: int) -> None:
    """A collection's element: a boolean there is a byte of its own (unlike a struct's boolean field)."""
    if kind in (_TRUE, _FALSE):
        reader.skip(1)
    else:
        _skip(reader, kind, depth)


def _struct(reader: _Reader, depth: int, wanted: dict[int, Any]) -> dict[int, Any]:
    """Read a struct, returning its i32 fields whose ids ``wanted`` maps to :data:`_I32` (id → its value), and for
    the ids it maps to a dict, what that dict wants of the nested struct there (a data page header's value count
    and encoding). As Arrow's Thrift code: a field of another wire type is skipped, a repeated one overrides (a
    struct field by field)."""
    found: dict[int, Any] = {}
    field_id = 0
    while True:
        header = reader.byte()
        kind = header & 0x0F
        if kind == 0:
            return found
        delta = header >> 4
        field_id = _int16(field_id + delta if delta else reader.i32())  # Thrift's C++ reads an int16 id
        if field_id in wanted and wanted[field_id] == _I32 and kind == _I32:
            found[field_id] = reader.i32()
        elif field_id in wanted and isinstance(wanted[field_id], dict) and kind == _STRUCT:
            found[field_id] = {**found.get(field_id, {}), **_struct(reader, depth + 1, wanted[field_id])}
        else:
            _skip(reader, kind, depth)


# PageHeader: 1 type, 2 uncompressed_page_size, 3 compressed_page_size; 5 DataPageHeader (1 num_values, 2 encoding),
# 7 DictionaryPageHeader (1 num_values), 8 DataPageHeaderV2 (1 num_values, 4 encoding) — parquet.thrift
_PAGE_HEADER = {1: _I32, 2: _I32, 3: _I32, 5: {1: _I32, 2: _I32}, 7: {1: _I32}, 8: {1: _I32, 4: _I32}}
_DATA_HEADERS = {DATA_PAGE: (5, 2), DATA_PAGE_V2: (8, 4)}  # a data page's type: its header's field, encoding's id


def chunk_pages(handle, start: int, length: int, size: int, budget: WalkBudget) -> ChunkPages:
    """The pages of the column chunk whose claimed range is ``start`` + ``length`` bytes of a file of ``size``
    bytes; ``budget``: what the body's walk may still do (spent here). 400 ``malformed_file`` for headers that
    cannot be read, 413 ``body_too_large`` past :data:`MAX_PAGES` or past the body's size in header bytes."""
    values = uncompressed = dictionary = plain_values = largest_plain = dictionary_values = 0
    fewest_plain: int | None = None
    last_plain: int | None = None  # the values of the latest plain page (not yet known not to be the last)
    first_encoding: int | None = None
    dictionary_after_plain = False
    encodings: set[int] = set()
    position = start
    reader = _Reader(handle, position, size, budget)
    try:
        while position == start or position < start + length:  # the first page is read whatever the claim
            budget.pages -= 1
            if budget.pages < 0 or budget.header_bytes <= 0:
                raise LabelDPError(f"the Parquet body has more than {MAX_PAGES:,} pages, or its chunks read its "
                                   "page headers more than once; write larger pages", code=ErrorCode.BODY_TOO_LARGE)
            reader.at(position, budget)
            found = _struct(reader, 0, _PAGE_HEADER)
            budget.header_bytes -= reader.position - position
            page_size, stored, kind = found.get(2, -1), found.get(3, -1), found.get(1)
            if page_size < 0 or stored < 0 or kind is None:
                raise _Malformed("a page header without its type or sizes")
            # an uncompressed page is its stored bytes whatever its header says (Arrow reads those: the seventeenth
            # review's dictionary page stating 0 bytes was read whole, +2,520 MB)
            page_size = max(page_size, stored)
            uncompressed += page_size
            if kind == DICTIONARY_PAGE:
                dictionary += page_size
                dictionary_values += max(found.get(7, {}).get(1, 0), 0)
            if kind in _DATA_HEADERS:
                field, encoding_id = _DATA_HEADERS[kind]
                data = found.get(field)
                if data is None or 1 not in data:  # Arrow would read it as an empty PLAIN page: no writer's
                    raise _Malformed("a data page without its data page header")
                page_values = max(data[1], 0)
                encoding = data.get(encoding_id)
                values += page_values
                first_encoding = encoding if first_encoding is None else first_encoding
                encodings.add(-1 if encoding is None else encoding)
                if encoding in DICTIONARY_ENCODINGS:
                    dictionary_after_plain = dictionary_after_plain or plain_values > 0
                else:
                    plain_values += page_values
                    largest_plain = max(largest_plain, page_size)
                    if last_plain is not None:
                        fewest_plain = last_plain if fewest_plain is None else min(fewest_plain, last_plain)
                    last_plain = page_values
            position = reader.position + stored
    except _Exhausted:
        raise LabelDPError("the Parquet body's chunks read its page headers more than once",
                           code=ErrorCode.BODY_TOO_LARGE) from None
    except _Malformed as error:
        raise LabelDPError(f"the Parquet body's pages cannot be read: {error}", code=ErrorCode.MALFORMED_FILE) from None
    return ChunkPages(values, uncompressed, dictionary, plain_values, first_encoding in DICTIONARY_ENCODINGS,
                      largest_plain, fewest_plain if fewest_plain is not None else (last_plain or 0),
                      dictionary_after_plain, frozenset(encodings), dictionary_values)


def column_chunk(handle, chunk: Any, size: int, budget: WalkBudget) -> ChunkPages:
    """:func:`chunk_pages` of a footer's column chunk (pyarrow's ``ColumnChunkMetaData``), from where Arrow starts
    reading it: its dictionary page when that comes first."""
    start = chunk.data_page_offset
    if chunk.has_dictionary_page and 0 < (chunk.dictionary_page_offset or 0) < start:
        start = chunk.dictionary_page_offset
    return chunk_pages(handle, start, chunk.total_compressed_size, size, budget)


def longest_entry(reader: Any, group: int, column: str) -> int:
    """The longest entry of the dictionary page of ``column`` in row group ``group``, ``reader`` a
    ``pyarrow.parquet.ParquetFile`` that reads the column as a dictionary: its first row's batch carries that
    page's entries whole (when the first data page is dictionary-encoded), and nothing else is read."""
    first = next(reader.iter_batches(batch_size=1, row_groups=[group], columns=[column]), None)
    dictionary = getattr(first.column(0), "dictionary", None) if first is not None else None
    if dictionary is None or not len(dictionary):
        return 0
    return int(pc.max(pc.binary_length(dictionary)).as_py() or 0)
