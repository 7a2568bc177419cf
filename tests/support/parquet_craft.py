"""Parquet files written byte by byte (Thrift compact protocol), for bodies no honest writer makes: pages whose
headers claim what the test chooses (issue 40's ninth review: a page of one number that decompresses to a gigabyte).
Flat, required columns; one data page (v1, plain encoding) per chunk unless the caller passes several."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import pyarrow as pa

_I32, _I64, _BINARY, _LIST, _STRUCT = 5, 6, 8, 9, 12
I32, I64, STRUCT = _I32, _I64, _STRUCT  # the compact protocol's types, for tests that write headers field by field
_PHYSICAL = {"int64": 2, "double": 5, "byte_array": 6}
_CODECS = {"uncompressed": 0, "brotli": 4, "zstd": 6}


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _zigzag(value: int) -> bytes:
    return varint((value << 1) ^ (value >> 63))


def thrift_struct(*fields: tuple[int, int, object] | None) -> bytes:
    """A Thrift compact struct of (field id, type, value): an id 1 to 15 past the one before in the short form, any
    other (repeated, decreasing, far) in the long form; an integer given as bytes is written as they are."""
    out, last = bytearray(), 0
    for field_id, kind, value in (f for f in fields if f is not None):
        delta = field_id - last
        out += bytes([(delta << 4) | kind]) if 0 < delta <= 15 else bytes([kind]) + _zigzag(field_id)
        last = field_id
        out += _value(kind, value)
    return bytes(out) + b"\x00"


_struct = thrift_struct


def _value(kind: int, value) -> bytes:
    if kind in (_I32, _I64):
        return value if isinstance(value, bytes) else _zigzag(value)
    if kind == _BINARY:
        raw = value.encode() if isinstance(value, str) else value
        return varint(len(raw)) + raw
    if kind == _STRUCT:
        return value
    element, items = value  # a list
    head = bytes([(len(items) << 4) | element]) if len(items) < 15 else bytes([0xF0 | element]) + varint(len(items))
    return head + b"".join(_value(element, item) for item in items)


def data_page(raw: bytes, values: int, codec: str = "uncompressed", claimed: int | None = None,
              level: int | None = None, encoding: int = 0) -> bytes:
    """A v1 data page of ``values`` values (plain-encoded, or 8: dictionary indices) whose header says it
    decompresses to ``claimed`` bytes (default: what it does)."""
    body = raw if codec == "uncompressed" else pa.Codec(codec, compression_level=level).compress(raw, asbytes=True)
    header = _struct((1, _I32, 0), (2, _I32, len(raw) if claimed is None else claimed), (3, _I32, len(body)),
                     (5, _STRUCT, _struct((1, _I32, values), (2, _I32, encoding), (3, _I32, 3), (4, _I32, 3))))
    return header + body


def dictionary_page(raw: bytes, entries: int, codec: str = "uncompressed") -> bytes:
    """A dictionary page of ``entries`` plain-encoded values."""
    body = raw if codec == "uncompressed" else pa.Codec(codec).compress(raw, asbytes=True)
    return _struct((1, _I32, 2), (2, _I32, len(raw)), (3, _I32, len(body)),
                   (7, _STRUCT, _struct((1, _I32, entries), (2, _I32, 0)))) + body


def first_entry_indices(values: int) -> bytes:
    """A dictionary-encoded data page's body naming entry 0 ``values`` times (bit width 1, one RLE run)."""
    return bytes([1]) + varint(values << 1) + b"\x00"


def plain_strings(values: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


def plain_doubles(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


@dataclass(frozen=True)
class Column:
    name: str
    physical: str  # int64, double or byte_array
    pages: bytes  # the chunk: its pages, back to back
    values: int
    codec: str = "uncompressed"
    extra: bytes = field(default=b"")  # bytes after the chunk's claimed range (what a padding reader would read)
    dictionary: int = 0  # the bytes of the chunk's leading dictionary page (0: none)
    decimal: int | None = None  # a byte_array column's decimal precision (None: UTF-8 strings)


def parquet_file(columns: list[Column], rows: int, created_by: str = "parquet-cpp-arrow version 21.0.0") -> bytes:
    """One row group of ``columns``; the footer states each chunk as its pages' bytes (``extra`` left out)."""
    out, chunks = bytearray(b"PAR1"), []
    for column in columns:
        start = len(out)
        out += column.pages + column.extra
        size = len(column.pages)
        encodings = [0, 3, 8, 2] if column.dictionary else [0, 3]
        meta = _struct((1, _I32, _PHYSICAL[column.physical]), (2, _LIST, (_I32, encodings)),
                       (3, _LIST, (_BINARY, [column.name])), (4, _I32, _CODECS[column.codec]),
                       (5, _I64, column.values), (6, _I64, size), (7, _I64, size), (9, _I64, start + column.dictionary),
                       (11, _I64, start) if column.dictionary else None)
        chunks.append(_struct((2, _I64, start), (3, _STRUCT, meta)))
    schema = [_struct((4, _BINARY, "schema"), (5, _I32, len(columns)))]
    schema += [_struct((1, _I32, _PHYSICAL[c.physical]), (3, _I32, 0), (4, _BINARY, c.name),
                       (6, _I32, 0 if c.decimal is None else 5) if c.physical == "byte_array" else None,
                       (7, _I32, 0) if c.decimal else None, (8, _I32, c.decimal) if c.decimal else None)
               for c in columns]
    group = _struct((1, _LIST, (_STRUCT, chunks)), (2, _I64, len(out)), (3, _I64, rows))
    footer = _struct((1, _I32, 1), (2, _LIST, (_STRUCT, schema)), (3, _I64, rows), (4, _LIST, (_STRUCT, [group])),
                     (6, _BINARY, created_by))
    return bytes(out) + footer + struct.pack("<I", len(footer)) + b"PAR1"
