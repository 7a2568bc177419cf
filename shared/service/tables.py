"""Columnar downloads with content negotiation: a Parquet file streamed as CSV (the default), NDJSON or Parquet,
or paged as JSON — never loaded whole."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path

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


def table_response(path: Path, accept: str | None, offset: int, limit: int, filename: str,
                   rows: Callable[[pa.RecordBatch], list[dict]] | None = None) -> Response:
    """The table in the negotiated format; ``rows`` turns a batch into JSON/NDJSON rows (default: as is)."""
    media = negotiate(accept)
    rows = rows or (lambda batch: batch.to_pylist())
    if media == "application/json":
        return _json_page(path, offset, limit, rows)
    stream = {"text/csv": _csv_stream, "application/x-ndjson": lambda p: _ndjson_stream(p, rows),
              PARQUET: _parquet_stream}[media](path)
    disposition = {"Content-Disposition": f'attachment; filename="{filename}"'}
    return StreamingResponse(stream, media_type=media, headers=disposition)


def _batches(path: Path) -> Iterator[pa.RecordBatch]:
    for file in parquet_parts(path):
        parquet = pq.ParquetFile(file)
        yield from parquet.iter_batches(batch_size=max(1, BATCH_CELLS // len(parquet.schema_arrow)))


def _csv_stream(path: Path) -> Iterator[bytes]:
    first = True
    for batch in _batches(path):
        sink = pa.BufferOutputStream()
        pacsv.write_csv(pa.Table.from_batches([batch]), sink,
                        write_options=pacsv.WriteOptions(include_header=first, quoting_style="needed"))
        first = False
        yield sink.getvalue().to_pybytes()


def _ndjson_stream(path: Path, rows) -> Iterator[bytes]:
    for batch in _batches(path):
        yield ("\n".join(json.dumps(row) for row in rows(batch)) + "\n").encode()


def _parquet_stream(path: Path) -> Iterator[bytes]:
    if path.is_dir():  # part files: one Parquet stream re-encoded row group by row group
        yield from _merged_parquet(parquet_parts(path))
        return
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
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


def _merged_parquet(files: list[Path]) -> Iterator[bytes]:
    pipe, writer = _Pipe(), None
    for file in files:
        parquet = pq.ParquetFile(file)
        for group in range(parquet.metadata.num_row_groups):
            table = parquet.read_row_group(group)
            writer = writer or pq.ParquetWriter(pipe, table.schema, compression="zstd")
            writer.write_table(table)
            yield pipe.drain()
    if writer is not None:
        writer.close()
        yield pipe.drain()


def _json_page(path: Path, offset: int, limit: int, rows) -> JSONResponse:
    """Rows offset..offset+limit-1 — fewer when they are wide (``PAGE_CELLS``): ``next_offset`` says where to go on."""
    table, total = None, 0
    for file in parquet_parts(path):  # the part files hold consecutive rows
        parquet = pq.ParquetFile(file)
        limit = min(limit, max(1, PAGE_CELLS // len(parquet.schema_arrow)))
        count = parquet.metadata.num_rows
        if total + count > offset and total < offset + limit:
            part = _rows_between(parquet, max(0, offset - total), offset + limit - total)
            table = part if table is None else pa.concat_tables([table, part])
        total += count
    table = table if table is not None else pa.table({})
    items = rows(table.combine_chunks().to_batches()[0]) if table.num_rows else []
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
