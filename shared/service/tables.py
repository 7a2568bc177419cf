"""Columnar downloads with content negotiation: a Parquet file streamed as CSV (the default), NDJSON or Parquet,
or paged as JSON — never loaded whole."""

from __future__ import annotations

import io
import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, Protocol

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from fastapi.responses import JSONResponse, Response, StreamingResponse

from shared.errors import ErrorCode, LabelDPError
from shared.parts import parquet_parts

PARQUET = "application/vnd.apache.parquet"
# A page or a streamed batch is bounded in cells, not rows: a release of one column per class (subset's sets,
# ALIBI's vectors, up to 256 classes) would otherwise hold 128 times more per page than one of labels.
PAGE_CELLS = 200_000  # the most a JSON page holds: 100,000 rows of (example_id, label)
BATCH_CELLS = 1 << 17  # a streamed batch: 65,536 rows of two columns
MEDIA_TYPES = ("text/csv", "application/x-ndjson", PARQUET, "application/json")
_ALIASES = {"application/parquet": PARQUET, "application/ndjson": "application/x-ndjson",
            "application/jsonl": "application/x-ndjson", "text/*": "text/csv"}


def negotiate(accept: str | None) -> str:
    if not accept or "*/*" in accept:
        return "text/csv"
    for part in accept.split(","):
        media = part.split(";")[0].strip().lower()
        media = _ALIASES.get(media, media)
        if media in MEDIA_TYPES:
            return media
    raise LabelDPError(f"cannot produce {accept!r}; offered: {', '.join(MEDIA_TYPES)}", code=ErrorCode.NOT_ACCEPTABLE)


class OpenedTable(Protocol):
    """A table's part files, opened once (and checked, where the caller checks them): what is served is read from
    these descriptors only; ``unchanged()`` raises if a part was written since it was opened or checked (called
    after each read, before what was read is handed on); ``close()`` closes them."""

    parts: list[BinaryIO]

    def unchanged(self) -> None: ...

    def close(self) -> None: ...


class PlainTable:
    """An :class:`OpenedTable` of a file or a directory's part files a party wrote itself (a job's predictions):
    opened without following a link or waiting on a FIFO."""

    def __init__(self, path: Path):
        self.parts: list[BinaryIO] = []
        try:
            for part in parquet_parts(path):
                descriptor = os.open(part, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
                self.parts.append(os.fdopen(descriptor, "rb"))
                if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                    raise OSError(f"{part.name} is not a regular file")
        except BaseException:
            self.close()
            raise

    def unchanged(self) -> None:
        pass

    def close(self) -> None:
        for part in self.parts:
            part.close()


def table_response(table: OpenedTable, accept: str | None, offset: int, limit: int, filename: str,
                   rows: Callable[[pa.RecordBatch], list[dict]] | None = None) -> Response:
    """The table in the negotiated format; ``rows`` turns a batch into JSON/NDJSON rows (default: as is). The table
    is closed once it is answered (a stream: once it ends or is abandoned)."""
    try:
        media = negotiate(accept)
        rows = rows or (lambda batch: batch.to_pylist())
        if media == "application/json":
            try:
                return _json_page(table, offset, limit, rows)
            finally:
                table.close()
    except BaseException:
        table.close()
        raise
    stream = {"text/csv": _csv_stream, "application/x-ndjson": lambda t: _ndjson_stream(t, rows),
              PARQUET: _parquet_stream}[media](table)
    disposition = {"Content-Disposition": f'attachment; filename="{filename}"'}
    return StreamingResponse(_closing(stream, table), media_type=media, headers=disposition)


def _closing(stream: Iterator[bytes], table: OpenedTable) -> Iterator[bytes]:
    try:
        yield from stream
    finally:
        table.close()


def _batches(table: OpenedTable) -> Iterator[pa.RecordBatch]:
    for part in table.parts:
        parquet = pq.ParquetFile(part)
        for batch in parquet.iter_batches(batch_size=max(1, BATCH_CELLS // len(parquet.schema_arrow))):
            table.unchanged()
            yield batch


def _csv_stream(table: OpenedTable) -> Iterator[bytes]:
    first = True
    for batch in _batches(table):
        sink = pa.BufferOutputStream()
        pacsv.write_csv(pa.Table.from_batches([batch]), sink,
                        write_options=pacsv.WriteOptions(include_header=first, quoting_style="needed"))
        first = False
        yield sink.getvalue().to_pybytes()


def _ndjson_stream(table: OpenedTable, rows) -> Iterator[bytes]:
    for batch in _batches(table):
        yield ("\n".join(json.dumps(row) for row in rows(batch)) + "\n").encode()


def _parquet_stream(table: OpenedTable) -> Iterator[bytes]:
    if len(table.parts) != 1:  # part files: one Parquet stream re-encoded row group by row group
        yield from _merged_parquet(table)
        return
    while chunk := table.parts[0].read(1 << 20):
        table.unchanged()
        yield chunk


class _Pipe(io.RawIOBase):
    """A write-only file that hands what was written to the response, piece by piece."""

    def __init__(self) -> None:
        super().__init__()
        self._pieces: list[bytes] = []
        self._written = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._pieces.append(bytes(data))
        self._written += len(data)
        return len(data)

    def tell(self) -> int:
        return self._written

    def drain(self) -> bytes:
        data, self._pieces = b"".join(self._pieces), []
        return data


def _merged_parquet(table: OpenedTable) -> Iterator[bytes]:
    pipe, writer = _Pipe(), None
    for part in table.parts:
        parquet = pq.ParquetFile(part)
        for group in range(parquet.metadata.num_row_groups):
            read = parquet.read_row_group(group)
            table.unchanged()
            writer = writer or pq.ParquetWriter(pipe, read.schema, compression="zstd")
            writer.write_table(read)
            yield pipe.drain()
    if writer is not None:
        writer.close()
        yield pipe.drain()


def _json_page(table: OpenedTable, offset: int, limit: int, rows) -> JSONResponse:
    """Rows offset..offset+limit-1 — fewer when they are wide (``PAGE_CELLS``): ``next_offset`` says where to go on."""
    page, total = None, 0
    for part in table.parts:  # the part files hold consecutive rows
        parquet = pq.ParquetFile(part)
        limit = min(limit, max(1, PAGE_CELLS // len(parquet.schema_arrow)))
        count = parquet.metadata.num_rows
        if total + count > offset and total < offset + limit:
            read = _rows_between(parquet, max(0, offset - total), offset + limit - total)
            page = read if page is None else pa.concat_tables([page, read])
        total += count
    table.unchanged()
    page = page if page is not None else pa.table({})
    items = rows(page.combine_chunks().to_batches()[0]) if page.num_rows else []
    next_offset = offset + len(items) if offset + len(items) < total else None
    return JSONResponse({"items": items, "offset": offset, "total": total, "next_offset": next_offset})


def _rows_between(parquet: pq.ParquetFile, start: int, stop: int) -> pa.Table:
    """Rows start..stop-1, reading only the row groups that hold them (a page deep in 10⁸ rows reads one)."""
    groups: list[int] = []
    first = seen = 0  # first: the row the first of the groups starts at
    for group in range(parquet.metadata.num_row_groups):
        rows = parquet.metadata.row_group(group).num_rows
        if seen + rows > start and seen < stop:
            if not groups:
                first = seen
            groups.append(group)
        seen += rows
    if not groups:
        return parquet.schema_arrow.empty_table()
    return parquet.read_row_groups(groups).slice(start - first, stop - start)
