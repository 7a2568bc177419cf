"""What a Parquet column chunk's pages decode to, read from their own headers (issue 40's sixth review).

A Parquet file's footer *claims* each column chunk's uncompressed size and value count; the reader decompresses
each page into a buffer of the size its *page header* states. A body whose footer understates the chunk (a
one-row file whose footer says 200 bytes while its one page holds a 64 MiB string compressed to 2.7 KB) passed the
footer-based check and took the server to +1 GB. The page headers are what decompression obeys, so the limits are
checked against them too, before any page is decompressed: the bytes in the chunk's range (the range the reader
reads) are walked header by header — each header is parsed, its page body skipped unread.

A page header is a Thrift struct in the compact protocol (parquet-format's ``PageHeader``): field 2 is the
uncompressed page size, 3 the compressed size, and the data page headers (fields 5 and 8) start with their value
count. Only those are kept; every other field is skipped by type. pyarrow exposes none of this (its page reader is
internal), and no maintained Python library reads page headers alone, hence this reader.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc

from shared.errors import ErrorCode, LabelDPError

DICTIONARY_PAGE = 2  # a page header's type (parquet.thrift PageType)
MAX_PAGES = 200_000  # per body: a page header is at least ~6 bytes, so this bounds the walk's time (~1 s)
MAX_HEADER_BYTES = 1 << 20  # a page header (statistics included) larger than this is refused
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
# the encodings whose page bytes bound the strings they decode to: PLAIN, DELTA_LENGTH_BYTE_ARRAY, and the
# dictionary's indices (not DELTA_BYTE_ARRAY, 7: each value repeats a prefix of the one before, so 110 KB of pages
# decoded to 400 MB — the fourteenth review)
BOUNDED_STRING_ENCODINGS = frozenset({0, 6, *DICTIONARY_ENCODINGS})


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


class _Malformed(Exception):
    pass


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
        self.handle, self.position, self.size = handle, position, size
        self.window, self.start = b"", position
        self.end = min(size, position + MAX_HEADER_BYTES, position + max(0, budget.header_bytes))

    def left(self) -> int:
        return self.end - self.position

    def byte(self) -> int:
        offset = self.position - self.start
        if self.position >= self.end:
            raise _Malformed("a page header runs past the end of the file, or is larger than any writer makes")
        if not 0 <= offset < len(self.window):
            self.handle.seek(self.position)
            self.window, self.start, offset = self.handle.read(_WINDOW), self.position, 0
            if not self.window:
                raise _Malformed("a page header runs past the end of the file")
        self.position += 1
        return self.window[offset]

    def skip(self, count: int) -> None:
        if count < 0 or count > self.left():
            raise _Malformed("a page header names bytes past the end of the file, or is larger than any writer makes")
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

    def zigzag(self) -> int:
        value = self.varint()
        return (value >> 1) ^ -(value & 1)


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
    """Read a struct, returning the integer fields whose ids ``wanted`` maps to 0 (id → its value), and for the
    ids it maps to a dict, what that dict wants of the nested struct there (a data page header's value count and
    encoding)."""
    found: dict[int, Any] = {}
    field_id = 0
    while True:
        header = reader.byte()
        kind = header & 0x0F
        if kind == 0:
            return found
        delta = header >> 4
        field_id = field_id + delta if delta else reader.zigzag()
        if field_id in wanted and wanted[field_id] == 0 and kind in (_I32, _I64):
            found[field_id] = reader.zigzag()
        elif field_id in wanted and isinstance(wanted[field_id], dict) and kind == _STRUCT:
            found[field_id] = _struct(reader, depth + 1, wanted[field_id])
        else:
            _skip(reader, kind, depth)


def chunk_pages(handle, start: int, length: int, size: int, budget: WalkBudget) -> ChunkPages:
    """The pages of the column chunk whose claimed range is ``start`` + ``length`` bytes of a file of ``size``
    bytes; ``budget``: what the body's walk may still do (spent here). 400 ``malformed_file`` for headers that
    cannot be read, 413 ``body_too_large`` past :data:`MAX_PAGES` or past the body's size in header bytes."""
    values = uncompressed = dictionary = plain_values = largest_plain = 0
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
            reader = _Reader(handle, position, size, budget)
            # a data page header (v1, field 5; v2, field 8): its value count and encoding
            found = _struct(reader, 0, {1: 0, 2: 0, 3: 0, 5: {1: 0, 2: 0}, 8: {1: 0, 4: 0}})
            budget.header_bytes -= reader.position - position
            page_size, stored = found.get(2, -1), found.get(3, -1)
            if page_size < 0 or stored < 0:
                raise _Malformed("a page header without its sizes")
            uncompressed += page_size
            dictionary += page_size if found.get(1) == DICTIONARY_PAGE else 0
            data = found.get(5) or found.get(8)
            if data is not None:
                page_values = max(data.get(1, 0), 0)
                encoding = data.get(2 if 5 in found else 4)
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
    except _Malformed as error:
        if reader.position >= position + budget.header_bytes:  # the body's header bytes, not the header, ran out
            raise LabelDPError("the Parquet body's chunks read its page headers more than once",
                               code=ErrorCode.BODY_TOO_LARGE) from None
        raise LabelDPError(f"the Parquet body's pages cannot be read: {error}", code=ErrorCode.MALFORMED_FILE) from None
    return ChunkPages(values, uncompressed, dictionary, plain_values, first_encoding in DICTIONARY_ENCODINGS,
                      largest_plain, fewest_plain if fewest_plain is not None else (last_plain or 0),
                      dictionary_after_plain, frozenset(encodings))


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
