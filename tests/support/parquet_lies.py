"""A Parquet body whose footer understates its data (issue 40's sixth review), for the tests and the hostile-bodies
bench: the footer's uncompressed sizes rewritten in place (same lengths, so the file still parses) while the page
header still says what its page decompresses to."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

CLAIMED = 200  # what the footer says the first column's chunk and its row group hold, in bytes


def compact_varint(value: int, width: int) -> bytes:
    """``value`` zigzag-encoded as a Thrift compact varint of exactly ``width`` bytes (padded with 0x80s)."""
    zigzag, out = value << 1, bytearray()
    for i in range(width):
        out.append((zigzag & 0x7F) | (0x80 if i < width - 1 else 0))
        zigzag >>= 7
    return bytes(out)


def understated(table: pa.Table) -> bytes:
    """``table`` as Parquet (zstd, no dictionary) whose footer says its first column's chunk and its row group
    hold :data:`CLAIMED` bytes."""
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd", use_dictionary=False)
    data = bytearray(buffer.getvalue())
    metadata = pq.ParquetFile(io.BytesIO(bytes(data))).metadata
    length = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - length
    footer = bytes(data[start:-8])
    for value in {metadata.row_group(0).column(0).total_uncompressed_size, metadata.row_group(0).total_byte_size}:
        honest = compact_varint(value, max(1, -(-(value << 1).bit_length() // 7)))  # its minimal encoding
        assert honest in footer
        footer = footer.replace(honest, compact_varint(CLAIMED, len(honest)))
    data[start:-8] = footer
    assert pq.ParquetFile(io.BytesIO(bytes(data))).metadata.row_group(0).column(0).total_uncompressed_size == CLAIMED
    return bytes(data)
