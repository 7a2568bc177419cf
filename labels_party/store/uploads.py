"""Upload formats, and the per-example bodies of releases (priors, groups) read from a spooled file with pyarrow.

Labels themselves are parsed by :mod:`labels_party.store.labelstore`, batch by batch into Parquet row groups.

A prior or group body is bounded by what it **decodes to**, not by what it weighs (issue 40): Parquet compresses
and dictionary-encodes, so a 247 KB body held 10⁷ rows (it took the server from 342 MB to 3.9 GB before its 400),
and a CSV of short rows turns each 2-byte row into a Python string of ~60 bytes. So:

* a Parquet body's footer is bounded before it is parsed (:data:`MAX_PARQUET_FOOTER`: Thrift's compact metadata
  parses to up to ~230 times its size), and from its metadata alone —
  rows, and the values of the columns read × their decoded width, string columns by their uncompressed pages (read
  as dictionaries, never expanded to one string per row) — what it would decode to is refused past the limits
  before any page is read;
* every format is read in batches of bounded cells (:data:`PARSE_CELLS`), the rows and the strings kept counted
  as they come, refused past the limits: the body's decoded bytes (``max_bytes``) and the dataset's examples
  (``max_rows``: a body names each example at most once);
* NDJSON lines are checked for nesting while Arrow reads them (:class:`DepthLimited`): Arrow's JSON parser recurses,
  and one line of 20,000 nested brackets crashed the process (SIGSEGV);
* the K columns of K classes are found through a dict (a list searched per class took 27 s for 10,000 classes).

Refusals are 413 ``body_too_large`` saying what the body decodes to; nothing is stored or charged.
"""

from __future__ import annotations

import contextlib
import csv
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from shared import parquet_pages
from shared.errors import ErrorCode, LabelDPError, library_message, resource_error
from shared.service.budgets import Reservation

FORMATS = {
    "text/csv": "csv",
    "application/x-ndjson": "ndjson",
    "application/ndjson": "ndjson",
    "application/jsonl": "ndjson",
    "application/vnd.apache.parquet": "parquet",
    "application/parquet": "parquet",
    "application/x-parquet": "parquet",
}


def upload_format(content_type: str | None) -> str:
    media = (content_type or "").split(";")[0].strip().lower()
    if media not in FORMATS:
        raise LabelDPError(f"unsupported content type {media or '(none)'!r}; send text/csv, application/x-ndjson "
                           "or application/vnd.apache.parquet", code=ErrorCode.UNSUPPORTED_MEDIA_TYPE)
    return FORMATS[media]


# What one prior or group body may decode to in memory (LabelsSettings.max_columnar_decoded_bytes, its default).
MAX_DECODED_BYTES = 512 << 20
# Kept per row until the release is computed: an example id as a Python string in a list and its copies on the way
# to the lookup (a set, Arrow arrays of them, their match) — its characters counted apart (:func:`held_id_bytes`).
# Measured (issue 40's nineteenth review): 2.09·10⁶ group rows of 8-byte ids +421 MB, 1.32·10⁶ of 64-byte ids +673
# MB, i.e. about 133 bytes a row and 5.5 a character ...
ID_ROW_BYTES = 136
# ... per prior cell (a row's class): the parsed float64 matrix, its normalized copy, RRWithPrior's class order
# (int64), the sorted cumulative sums and their comparison (labels_party.core.solvers.rr_with_prior.plan_per_example)
# ...
PRIOR_CELL_BYTES = 48
# ... per group assignment: its code, the row's reference to its group's name, and the groups' arrays on the way to
# the release (measured: 2.58·10⁶ rows took 1.12–1.25 times their count at 24 bytes).
GROUP_ROW_BYTES = 64
PARSE_CELLS = 1 << 20  # cells (rows × columns) per batch handed on
BLOCK_BYTES = 1 << 22  # CSV and NDJSON are read in blocks of this size
STREAM_BUFFER = 1 << 20  # Parquet is read through a buffer of this size (never a whole column chunk at once)
PLAIN_BATCH_BYTES = 16 << 20  # a batch of strings read plain holds at most about this many bytes of them
# A Parquet footer (its metadata) longer than this is refused before it is parsed: Arrow's parsed metadata takes
# ~10 times a written footer's bytes (a 29 MB footer of 10⁵ columns took 273 MB), and up to ~230 times for a footer
# of minimal column chunks (3 bytes each in Thrift, ~680 in memory: 3 MB took 680 MB, 750 KB 172 MB). 512 KiB (at
# most ~120 MB parsed, once: the file is then opened with that metadata): ~1,700 columns of priors in one row group
# (more classes: send CSV or NDJSON), ~850 row groups of labels — for every body, uploads too (issue 40's eleventh
# review: a label upload's footer of 1 % of its size, 2.97 MB of minimal chunks in 300 MB, parsed to +676 MB).
MAX_PARQUET_FOOTER = 512 << 10
MAX_NDJSON_DEPTH = 32  # opening brackets in an NDJSON line (these bodies' rows are flat objects)
EXTRA_KEYS = 64  # keys an NDJSON line may hold besides the columns read (each costs Arrow a column)
WIDE_COLUMNS = 1024  # columns read at once by Arrow; priors over more classes are read otherwise
# A CSV header line: a prior body over 100,000 classes names ~690 KB of columns (the eighteenth review: 16 MiB of
# short names parsed by Python's csv module took +424 MB)
MAX_HEADER_BYTES = 2 << 20


def parse_priors(path: Path, fmt: str, num_classes: int, *, max_rows: int | None = None,
                 max_bytes: int = MAX_DECODED_BYTES,
                 memory: Reservation | None = None) -> tuple[list[str], np.ndarray]:
    """Per-example priors: columns example_id and p_0..p_{K-1} (non-negative, finite, not all zero per row); at
    most ``max_rows`` rows decoding to at most ``max_bytes`` (else 413 body_too_large), held in ``memory`` as
    they are counted (the process's share for such bodies: 503 server_busy when it is not free)."""
    names = [f"p_{k}" for k in range(num_classes)]
    decoded = prior_body_decoded(num_classes, max_rows, max_bytes, memory)
    ids: list[str] = []
    blocks: list[np.ndarray] = []
    with _parsing("the priors"):
        if fmt == "parquet":
            ids, priors = _parquet_priors(path, names, decoded)
        elif len(names) + 1 > WIDE_COLUMNS:
            ids, priors = _text_priors(path, fmt, names, decoded)
        else:
            for batch in _batches(path, fmt, ["example_id", *names], decoded, numeric=names, required=True):
                ids.extend(_id_strings(batch.column(0), decoded))
                blocks.append(_matrix(batch.drop_columns(["example_id"])))
            priors = np.concatenate(blocks) if len(blocks) > 1 else blocks[0] if blocks else np.empty((0, 0))
            del blocks
    if not ids:
        raise LabelDPError("no priors in the body", code=ErrorCode.EMPTY_LABELS)
    if not np.all(np.isfinite(priors)) or np.any(priors < 0) or np.any(priors.sum(axis=1) <= 0):
        raise LabelDPError("priors must be finite, non-negative and not all zero in a row",
                           code=ErrorCode.INVALID_PRIOR)
    return ids, priors


def prior_body_decoded(num_classes: int, max_rows: int | None, max_bytes: int,
                       memory: Reservation | None = None) -> Decoded:
    """What a per-example prior body over ``num_classes`` classes decodes to, counted as it is parsed (and as a
    release check counts a body to come: :class:`labels_party.releases.kinds.ExamplePriorShape`)."""
    return Decoded("the priors", max_rows, max_bytes, row_bytes=ID_ROW_BYTES + PRIOR_CELL_BYTES * num_classes,
                   memory=memory)


MAX_GROUP_NAME = 200  # characters


def parse_groups(path: Path, fmt: str, *, max_rows: int | None = None, max_bytes: int = MAX_DECODED_BYTES,
                 memory: Reservation | None = None) -> tuple[list[str], np.ndarray]:
    """Group assignments: columns example_id and group (any strings or integers); at most ``max_rows`` rows
    decoding to at most ``max_bytes`` (else 413 body_too_large), held in ``memory`` as in :func:`parse_priors`."""
    decoded = Decoded("the groups", max_rows, max_bytes, row_bytes=ID_ROW_BYTES + GROUP_ROW_BYTES, memory=memory)
    ids: list[str] = []
    groups = _Groups(decoded)
    with _parsing("the groups"):
        for batch in _batches(path, fmt, ["example_id", "group"], decoded, numeric=(), required=False):
            if batch.num_columns < 2:
                raise LabelDPError("groups need columns example_id and group", code=ErrorCode.MALFORMED_FILE)
            ids.extend(_id_strings(batch.column(0), decoded))
            groups.add(batch.column(1))
    if not ids:
        raise LabelDPError("no group assignments in the body", code=ErrorCode.EMPTY_LABELS)
    return ids, groups.of_rows()


@dataclass
class Decoded:
    """What a body has decoded to so far: its rows (at most ``max_rows``) and bytes (at most ``limit``): the rows'
    own cost (``row_bytes`` each) and the strings kept; refused (413 body_too_large) past either. Each count (or a
    Parquet body's prediction from its metadata) is held in ``memory``, the request's share of the process's budget
    for such bodies, before the rows are: what every body being decoded or released at once holds stays within it."""

    what: str
    max_rows: int | None
    limit: int
    row_bytes: int
    rows: int = 0
    strings: int = 0
    lengths: Memo = field(default_factory=lambda: Memo())  # the ids' dictionary's string lengths
    memory: Reservation | None = None

    def add(self, rows: int = 0, strings: int = 0) -> None:
        self.rows, self.strings = self.rows + rows, self.strings + strings
        self.check(self.rows, self.rows * self.row_bytes + self.strings)

    def check(self, rows: int, total: int, how: str = "") -> None:
        if self.max_rows is not None and rows > self.max_rows:
            raise LabelDPError(f"{self.what} have {rows:,} rows{how}; the dataset has {self.max_rows:,} examples and "
                               "a body names each at most once", code=ErrorCode.BODY_TOO_LARGE)
        if total > self.limit:
            raise LabelDPError(f"{self.what} decode to {total:,} bytes{how}, over this deployment's limit of "
                               f"{self.limit:,} (max_columnar_decoded_bytes): send fewer rows per request",
                               code=ErrorCode.BODY_TOO_LARGE)
        if self.memory is not None:
            self.memory.hold(total)


def _batches(path: Path, fmt: str, columns: list[str], decoded: Decoded, *, numeric: Sequence[str],
             required: bool) -> Iterator[pa.RecordBatch]:
    """The body's ``columns`` that it has (in that order; one missing is refused when ``required``), in batches of
    at most :data:`PARSE_CELLS` cells, each counted in ``decoded`` (rows) before it is handed on. ``numeric``:
    columns read as float64 from CSV and NDJSON (a Parquet body's types are its own)."""
    source: Any  # the Parquet body's batches, or Arrow's streaming reader of a CSV or NDJSON body
    with pa.OSFile(str(path)) as handle:  # a handle, not the path: no library message can name the spooled file
        if fmt == "parquet":
            source = _parquet(handle, columns, decoded, required)
        elif fmt == "csv":  # only the columns read are converted (Arrow takes ~8.5 KB per column it converts)
            present = [columns[i] for i in _positions(columns, _csv_header(handle), False)]
            _positions(present, columns, required)
            source = pacsv.open_csv(handle, read_options=pacsv.ReadOptions(block_size=BLOCK_BYTES),
                                    convert_options=pacsv.ConvertOptions(include_columns=present, column_types={
                                        "example_id": pa.string(), **dict.fromkeys(numeric, pa.float64())}))
        else:  # a line's keys bounded too: Arrow builds a column per key it meets (~3 KB each)
            source = pajson.open_json(pa.PythonFile(DepthLimited(handle, keys=len(columns) + EXTRA_KEYS), mode="r"),
                                      read_options=pajson.ReadOptions(block_size=BLOCK_BYTES),
                                      parse_options=pajson.ParseOptions(explicit_schema=pa.schema(
                                          [(name, pa.float64()) for name in numeric]) if numeric else None))
        wanted: list[int] | None = None
        for batch in source:
            if wanted is None:
                wanted = _positions(batch.schema.names, columns, required)
            step = max(1, PARSE_CELLS // max(1, len(wanted)))
            for start in range(0, batch.num_rows, step):
                part = batch.slice(start, step).select(wanted)
                decoded.add(rows=part.num_rows)
                yield part
        if wanted is None and hasattr(source, "schema"):  # no batch at all (CSV, NDJSON): the columns are checked
            _positions(source.schema.names, columns, required)


def _positions(names: Sequence[str], columns: Sequence[str], required: bool) -> list[int]:
    """Where ``columns`` are among ``names`` (those present, in ``columns``' order)."""
    index = {name: i for i, name in enumerate(names)}  # a dict: K classes are K lookups, not K² compares
    missing = [c for c in columns if c not in index]
    if missing and required:
        more = f"..{columns[-1]}" if len(columns) > 2 else ""
        raise LabelDPError(f"the body needs columns {', '.join(columns[:2])}{more}; missing {missing[:3]}",
                           code=ErrorCode.MALFORMED_FILE)
    return [index[c] for c in columns if c in index]


def _csv_header(handle) -> list[str]:
    """The column names of the CSV body open on ``handle`` (left at its start)."""
    line = handle.read(MAX_HEADER_BYTES).split(b"\n", 1)
    handle.seek(0)
    if len(line) < 2 and len(line[0]) >= MAX_HEADER_BYTES:
        raise LabelDPError(f"the CSV header is longer than {MAX_HEADER_BYTES:,} bytes", code=ErrorCode.MALFORMED_FILE)
    return next(csv.reader([line[0].decode("utf-8").removeprefix("\ufeff")]), [])


def _parquet_priors(path: Path, names: list[str], decoded: Decoded) -> tuple[list[str], np.ndarray]:
    """A Parquet body's ids, then its priors :data:`WIDE_COLUMNS` columns at a time into a matrix sized from its
    metadata (Arrow takes ~9 KB per column it reads: 100,000 classes at once took 931 MB)."""
    with pa.OSFile(str(path)) as handle:
        metadata = parquet_metadata(handle)
        schema = metadata.schema.to_arrow_schema()
        columns = ["example_id", *names]
        _positions(schema.names, columns, True)
        size = parquet_decoded(metadata, columns, handle)
        decoded.check(size.rows, size.rows * decoded.row_bytes + size.total, " (from the Parquet metadata)")
        body = pq.ParquetFile(handle, metadata=metadata, buffer_size=STREAM_BUFFER, pre_buffer=False)
        ids: list[str] = []
        for batch in parquet_batches(handle, metadata, size, ["example_id"], PARSE_CELLS):
            decoded.add(rows=batch.num_rows)
            ids.extend(_id_strings(batch.column(0), decoded))
        priors = np.empty((len(ids), len(names)))
        for start in range(0, len(names), WIDE_COLUMNS):
            group, row = names[start:start + WIDE_COLUMNS], 0
            for batch in body.iter_batches(batch_size=max(1, PARSE_CELLS // len(group)), columns=group):
                priors[row:row + batch.num_rows, start:start + len(group)] = _matrix(batch.select(group))
                row += batch.num_rows
    return ids, priors


def _text_priors(path: Path, fmt: str, names: list[str], decoded: Decoded) -> tuple[list[str], np.ndarray]:
    """Priors over more than :data:`WIDE_COLUMNS` classes from CSV or NDJSON, row by row (Arrow's readers take
    ~8.5 KB (CSV) or ~3 KB (NDJSON) per column: 100,000 classes took 850 MB and 325 MB)."""
    ids: list[str] = []
    rows: list[np.ndarray] = []
    longest = 64 * (len(names) + 1) + (1 << 16)  # bytes of a row: ~64 per number, and an id
    with open(path, "rb") as raw:
        lines = _lines(raw, longest)
        if fmt == "csv":
            reader = csv.reader(line.decode("utf-8") for line in lines)
            header = next(reader, None)
            if header is None:
                return ids, np.empty((0, len(names)))
            header[0] = header[0].removeprefix("\ufeff")
            at = _positions(header, ["example_id", *names], True)
            for row in reader:
                if not row:  # a blank line: counted as a row (each costs this loop; 200 MiB of them took 32 s)
                    decoded.add(rows=1)
                    continue
                if len(row) != len(header):
                    raise LabelDPError(f"a CSV row has {len(row):,} fields, the header {len(header):,}",
                                       code=ErrorCode.MALFORMED_FILE)
                ids.append(_counted_id(row[at[0]], decoded))
                rows.append(np.array([row[i] for i in at[1:]], dtype=np.float64))
        else:
            for line in lines:
                if not line.strip():
                    decoded.add(rows=1)
                    continue
                if line.count(b"[") + line.count(b"{") > MAX_NDJSON_DEPTH:
                    raise LabelDPError(f"an NDJSON line holds more than {MAX_NDJSON_DEPTH} opening brackets; its "
                                       "rows are flat objects", code=ErrorCode.MALFORMED_FILE)
                row = json.loads(line)
                if not isinstance(row, dict) or len(row) > len(names) + 1 + EXTRA_KEYS:
                    raise LabelDPError("an NDJSON line is not one flat object of example_id and p_0..",
                                       code=ErrorCode.MALFORMED_FILE)
                ids.append(_counted_id(row.get("example_id"), decoded))
                values = [row.get(name) for name in names]
                if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                    raise LabelDPError("a prior is missing or not a number", code=ErrorCode.MALFORMED_FILE)
                rows.append(np.array(values, dtype=np.float64))
    return ids, np.vstack(rows) if rows else np.empty((0, len(names)))


def _lines(raw, longest: int) -> Iterator[bytes]:
    while line := raw.readline(longest):
        if len(line) >= longest and not line.endswith(b"\n"):
            raise LabelDPError(f"a row is longer than {longest:,} bytes", code=ErrorCode.MALFORMED_FILE)
        yield line


def _counted_id(value: Any, decoded: Decoded) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value:
        raise LabelDPError("an example_id is missing or empty", code=ErrorCode.MALFORMED_FILE)
    decoded.add(rows=1, strings=held_id_size(value))  # a lone surrogate (JSON escapes it): UnicodeEncodeError
    return value


def _parquet(handle, columns: list[str], decoded: Decoded, required: bool) -> Iterator[pa.RecordBatch]:
    """The body's batches, once its footer's length and what its metadata says the columns decode to are within
    the limits (strings as :func:`parquet_batches` reads them)."""
    metadata = parquet_metadata(handle)
    schema = metadata.schema.to_arrow_schema()
    names = schema.names  # a new list at each access: taken once (K classes, K columns)
    read = [names[i] for i in _positions(names, columns, required)]
    size = parquet_decoded(metadata, read, handle)
    decoded.check(size.rows, size.rows * decoded.row_bytes + size.total, " (from the Parquet metadata)")
    return parquet_batches(handle, metadata, size, read, max(1, PARSE_CELLS // max(1, len(read))))


FOOTER_LIST_LIMIT = 20_000  # row groups, columns or key-values in one list of a footer


# Row groups a Parquet body may have: each costs its pages' walk and a reader's set-up (~0.5 ms), so many tiny ones
# make a small body expensive (issue 40's seventeenth review: 5,300 row groups in 994 KB, 2.5 s of CPU). Writers'
# row groups are megabytes (pyarrow: 2²⁰ rows; Spark: 128 MB), and a writer streaming batches of 1,024 rows makes
# row groups of ~6 KB (a million labels: 977 in 5.8 MB).
FEW_ROW_GROUPS, ROW_GROUP_BYTES = 100, 4 << 10


def parquet_metadata(handle, max_footer: int = MAX_PARQUET_FOOTER) -> pq.FileMetaData:
    """The metadata of the Parquet file open on ``handle`` (left at its start), its footer no longer than
    ``max_footer`` bytes (413 before it is parsed)."""
    size = handle.size()
    if size >= 12:
        handle.seek(size - 8)
        tail = handle.read(8)
        footer = int.from_bytes(tail[:4], "little")
        if tail[4:] == b"PAR1" and max_footer < footer <= size - 12:  # a longer one is malformed (Arrow says so)
            raise LabelDPError(f"the Parquet footer (its metadata) is {footer:,} bytes, over {max_footer:,}: write "
                               "fewer row groups or columns (priors over thousands of classes: send CSV or NDJSON)",
                               code=ErrorCode.BODY_TOO_LARGE)
    handle.seek(0)
    try:
        # Arrow reserves a footer list's declared length before reading it (the seventeenth review: 40 bytes
        # declaring 10⁶ row groups of 10⁶ chunks, +832 MB): no footer of MAX_PARQUET_FOOTER has a list this long
        metadata = pq.ParquetFile(handle, thrift_container_size_limit=FOOTER_LIST_LIMIT,
                                  thrift_string_size_limit=max_footer).metadata
        # decoded here, once: text that is not UTF-8 (a writer string, a column name) fails in Arrow as a
        # UnicodeDecodeError wherever it is first read (the tenth review: a 500 on label uploads)
        metadata.created_by, metadata.schema.to_arrow_schema().names  # noqa: B018
    except UnicodeDecodeError:
        raise LabelDPError("the Parquet metadata holds text that is not UTF-8", code=ErrorCode.MALFORMED_FILE) from None
    except OSError as error:  # Arrow's own refusal of a footer past its limits
        raise LabelDPError(f"the Parquet footer cannot be read: {str(error)[:200]}",
                           code=ErrorCode.MALFORMED_FILE) from None
    handle.seek(0)
    groups = FEW_ROW_GROUPS + size // ROW_GROUP_BYTES
    if metadata.num_row_groups > groups:
        raise LabelDPError(f"the Parquet body has {metadata.num_row_groups:,} row groups in {size:,} bytes; at most "
                           f"{groups:,} (row groups of {ROW_GROUP_BYTES >> 10} KiB or more): write larger row groups",
                           code=ErrorCode.MALFORMED_FILE)
    return metadata


# The Arrow types a body's columns may have: names (ids, groups) strings or integers, numbers integers, floats,
# booleans or decimals (read as float64) — each plain or dictionary-encoded. Any other is refused before it is read:
# the tenth review's string_view and JSON extension ids were read whole and uncounted (1 KB → +1.2 GB), and
# fixed-size binary ids held 5× what was counted.
NAME_COLUMNS = ("example_id", "group")


def _type_allowed(kind: pa.DataType, name: bool) -> bool:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if name:
        return any(check(kind) for check in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                                             pa.types.is_large_binary, pa.types.is_integer))
    return any(check(kind) for check in (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean,
                                         pa.types.is_decimal))


def check_column_types(schema: pa.Schema, columns: Sequence[str]) -> None:
    """400 ``malformed_file`` for a column of ``columns`` whose type is not one these bodies take (see above)."""
    for name in columns:
        if len(schema.get_all_field_indices(name)) > 1:  # Schema.field would raise (the seventeenth review: a 500)
            raise LabelDPError(f"the body has more than one column {name!r}", code=ErrorCode.MALFORMED_FILE)
        kind = schema.field(name).type
        if not _type_allowed(kind, name in NAME_COLUMNS):
            what = "strings or integers" if name in NAME_COLUMNS else "numbers (integers, floats, booleans or decimals)"
            raise LabelDPError(f"column {name!r} must hold {what}, not {kind}", code=ErrorCode.MALFORMED_FILE)


@dataclass(frozen=True)
class DecodedSize:
    """What reading some columns of a Parquet body decodes to at most (rows, bytes), and what the page headers of
    its string columns' chunks state, by (row group, column)."""

    rows: int
    total: int
    text_chunks: dict[tuple[int, str], parquet_pages.ChunkPages]
    stored: int = 0  # the read columns' chunks' bytes in the body (their pages walked: not a mere claim)


def parquet_decoded(metadata: pq.FileMetaData, columns: Sequence[str], handle) -> DecodedSize:
    """What reading ``columns`` of the Parquet file open on ``handle`` decodes to at most, from its
    metadata and its pages' headers (:mod:`shared.parquet_pages`: the footer's sizes are claims, the page
    headers are what decompression obeys; the larger counts), before any page is decompressed: a fixed-width value
    its width (at least 8: numbers are read as float64); a string (read as a dictionary) 4 bytes of index per
    value, and twice its column's uncompressed pages (the dictionary, and Arrow's copy of it); any other column its
    values' width plus what its pages decompress to (a page of one number may claim a gigabyte; a dictionary page
    is alive beside the values it decodes to, and so is Arrow's copy of it). A nested column
    (values repeated within a row) is refused: these bodies are flat, and their columns' types those
    :func:`check_column_types` allows."""
    parquet_pages.check_writer(metadata.created_by)
    check_column_types(metadata.schema.to_arrow_schema(), columns)
    leaves = _flat_leaves(metadata, columns)
    total, size, text_chunks, stored = 0, handle.size(), {}, 0
    arrow = metadata.schema.to_arrow_schema()
    strings = set(text_columns(arrow, columns))
    budget = parquet_pages.WalkBudget(parquet_pages.MAX_PAGES, size)
    rows = {i: 0 for i, _, _, _ in leaves}  # a flat column's values: one per row (nulls included)
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for i, name, physical, length in leaves:
            chunk = row_group.column(i)
            pages = parquet_pages.column_chunk(handle, chunk, size, budget)
            stored += chunk.total_compressed_size
            values = max(chunk.num_values, pages.values)
            rows[i] += values
            if physical == "BYTE_ARRAY":
                if name not in strings:  # a decimal in variable-length bytes: read whole, no bounded batches
                    raise LabelDPError(f"column {name!r} holds decimals as variable-length bytes: write them as "
                                       "integers, floats or fixed-length decimals", code=ErrorCode.MALFORMED_FILE)
                if not pages.encodings <= parquet_pages.BOUNDED_STRING_ENCODINGS:
                    raise LabelDPError(f"column {name!r} has string pages in a delta encoding (DELTA_BYTE_ARRAY or "
                                       "DELTA_LENGTH_BYTE_ARRAY), whose bytes do not bound what they decode to: "
                                       "write strings plain or dictionary-encoded", code=ErrorCode.MALFORMED_FILE)
                if pa.types.is_dictionary(arrow.field(name).type) and pages.plain_values:
                    raise LabelDPError(  # read as strings it would be one dictionary of the row group (+1,018 MB)
                        f"column {name!r} is stored with Arrow's dictionary type but not wholly dictionary-encoded: "
                        "write it as plain strings (not a pandas category)", code=ErrorCode.MALFORMED_FILE)
                total += (4 * values + 2 * max(chunk.total_uncompressed_size, pages.uncompressed)
                          + parquet_pages.DICTIONARY_ENTRY_BYTES * pages.dictionary_values)
                text_chunks[(group, name)] = pages
            else:  # decoded values and the pages decompressed to read them (the ninth review: 1 GiB in 1.8 KB),
                if not pages.encodings <= parquet_pages.BOUNDED_ENCODINGS:
                    raise LabelDPError(f"column {name!r} has pages in an encoding its type does not take here "
                                       "(a byte-array delta): write it plain or dictionary-encoded",
                                       code=ErrorCode.MALFORMED_FILE)
                # and a dictionary twice: its page and Arrow's decoded copy (the tenth: 10 columns, 2× counted),
                # and each entry's pointer and value (the sixteenth: 3.2·10⁷ one-byte decimals, +310 MB counted 2×)
                width = length + 8 if physical == "FIXED_LEN_BYTE_ARRAY" else 16 if physical == "INT96" else 8
                total += (values * width + pages.uncompressed + pages.dictionary
                          + (8 + width) * pages.dictionary_values)
    handle.seek(0)
    return DecodedSize(max(metadata.num_rows, *rows.values(), 0), total, text_chunks, min(stored, size))


def _flat_leaves(metadata: pq.FileMetaData, columns: Sequence[str]) -> list[tuple[int, str, str, int]]:
    """The leaf columns read of ``columns`` (position, name, physical type, fixed length); a nested one refused."""
    wanted, schema, leaves = set(columns), metadata.schema, []
    for i in range(metadata.num_columns):
        column = schema.column(i)
        top = column.path.split(".")[0]
        if top not in wanted and column.path not in wanted:
            continue
        if column.max_repetition_level > 0 or column.path not in wanted:
            raise LabelDPError(f"column {top!r} is nested; these bodies have flat columns",
                               code=ErrorCode.MALFORMED_FILE)
        leaves.append((i, column.path, column.physical_type, column.length or 0))
    return leaves


def parquet_batches(handle, metadata: pq.FileMetaData, size: DecodedSize, columns: Sequence[str],
                    batch_rows: int) -> Iterator[pa.RecordBatch]:
    """``columns`` of the Parquet body open on ``handle`` (``size``: :func:`parquet_decoded` of them), row group by
    row group, in batches of at most ``batch_rows``. A row group whose string chunks are wholly
    dictionary-encoded is read as dictionaries (a row never copies the entry it names). Any other is read as
    strings — as dictionaries, Arrow would build one of the whole row group's strings (~170 bytes a row: an honest
    upload of 2·10⁶ unique ids peaked at +334 MB) — in batches that hold at most about :data:`PLAIN_BATCH_BYTES`
    of them: of the longest entry of a chunk's dictionary page (read first, on its own) per dictionary-encoded row,
    and of the plain pages a batch's rows can span. A chunk with a dictionary-encoded page after a plain one (no
    writer falls back that way) is refused: its entries' length would be unknown until its rows were read."""
    text = text_columns(metadata.schema.to_arrow_schema(), columns)
    as_dictionaries = pq.ParquetFile(handle, metadata=metadata, buffer_size=STREAM_BUFFER, pre_buffer=False,
                                     read_dictionary=text or None)
    if not text:
        yield from as_dictionaries.iter_batches(batch_size=batch_rows, columns=list(columns))
        return
    as_strings = pq.ParquetFile(handle, metadata=metadata, buffer_size=STREAM_BUFFER, pre_buffer=False)
    for group in range(metadata.num_row_groups):
        chunks = {name: size.text_chunks[(group, name)] for name in text}
        if all(pages.dictionary and not pages.plain_values for pages in chunks.values()):
            rows = min([batch_rows, *(_dictionary_rows(as_dictionaries, group, name, pages, batch_rows)
                                      for name, pages in chunks.items())])
            yield from as_dictionaries.iter_batches(batch_size=rows, row_groups=[group], columns=list(columns))
        else:
            rows = min([batch_rows, *(_plain_rows(as_dictionaries, group, name, pages) for name, pages in
                                      chunks.items())])
            yield from as_strings.iter_batches(batch_size=rows, row_groups=[group], columns=list(columns))


def _dictionary_rows(reader: pq.ParquetFile, group: int, name: str, pages: parquet_pages.ChunkPages,
                     batch_rows: int) -> int:
    """The rows of a batch of a wholly dictionary-encoded chunk whose strings, once made (staging casts them), hold
    at most about :data:`PLAIN_BATCH_BYTES` (the seventeenth review: 60 rows naming one 8 MB entry, 480 MB in one
    batch). An entry is at most the page's bytes less 4 for each other entry; only if that allows fewer rows than
    ``batch_rows`` is the longest entry read."""
    bound = pages.dictionary - 4 * max(0, pages.dictionary_values - 1)
    if batch_rows * (bound + 16) <= PLAIN_BATCH_BYTES:
        return batch_rows
    return max(1, PLAIN_BATCH_BYTES // (parquet_pages.longest_entry(reader, group, name) + 16))


def _plain_rows(reader: pq.ParquetFile, group: int, name: str, pages: parquet_pages.ChunkPages) -> int:
    """The rows of a batch that reads column ``name`` of row group ``group`` as strings within
    :data:`PLAIN_BATCH_BYTES`: its plain pages (R rows span at most R / fewest + 1 of them, each at most the
    largest) and its dictionary-encoded rows (each at most the dictionary page's longest entry)."""
    if pages.dictionary_after_plain:
        raise LabelDPError(f"the Parquet body's column {name!r} has dictionary-encoded pages after plain ones; write "
                           "it again with a current writer", code=ErrorCode.MALFORMED_FILE)
    rows = PLAIN_BATCH_BYTES
    if pages.plain_values:
        spans = PLAIN_BATCH_BYTES // max(1, pages.largest_plain_page) - 1
        rows = min(rows, max(1, spans * max(1, pages.fewest_plain_values)))
    if pages.dictionary and pages.plain_values < pages.values:  # dictionary-encoded rows, the first page one
        longest = parquet_pages.longest_entry(reader, group, name)
        rows = min(rows, max(1, PLAIN_BATCH_BYTES // (longest + 16)))
    return rows


def string_bytes(column: pa.Array, memo: Memo | None = None) -> int:
    """The bytes of the strings a column's rows hold (a dictionary column: those its rows name, without making
    them); 0 for a column of other values."""
    if pa.types.is_dictionary(column.type):
        return dictionary_strings(column, memo)
    if pa.types.is_string(column.type) or pa.types.is_binary(column.type) or \
            pa.types.is_large_string(column.type) or pa.types.is_large_binary(column.type):
        return int(pc.sum(pc.binary_length(column)).as_py() or 0)
    return 0


def _text(kind: pa.DataType) -> bool:
    """Strings or bytes, plain or dictionary-encoded in the schema (not decimals stored as bytes)."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return any(check(kind) for check in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                                         pa.types.is_large_binary))


def text_columns(schema: pa.Schema, names: Sequence[str]) -> list[str]:
    """Which of ``names`` hold strings (read as dictionaries: never one copy of a string per row)."""
    wanted = set(names)
    return [field.name for field in schema if field.name in wanted and _text(field.type)]


def dictionary_strings(column: pa.Array, memo: Memo | None = None) -> int:
    """The bytes of the strings a dictionary-encoded column's rows name (what decoding it makes), without making
    them; 0 for a column of other values."""
    if not pa.types.is_dictionary(column.type) or pa.types.is_integer(column.dictionary.type) or \
            pa.types.is_floating(column.dictionary.type):
        return 0
    convert = lambda d: pc.binary_length(pc.cast(d, pa.binary()))  # noqa: E731
    lengths = memo.get(column.dictionary, convert) if memo is not None else convert(column.dictionary)
    return int(pc.sum(lengths.take(column.indices)).as_py() or 0)


class DepthLimited:
    """A binary file, read forward only, whose NDJSON lines hold at most ``limit`` opening brackets (``[`` or
    ``{``, inside strings too: a bound on their nesting depth that numpy counts at ~1 ms per MB), checked as Arrow
    reads it."""

    def __init__(self, raw, limit: int = MAX_NDJSON_DEPTH, keys: int | None = None):
        self.raw, self.limit, self.keys, self.closed = raw, limit, keys, False
        self.carry = self.colons = 0

    def read(self, size: int | None = -1) -> bytes:
        data = self.raw.read() if size is None or size < 0 else self.raw.read(size)
        if data:
            self._check(data)
        return data

    def _check(self, data: bytes) -> None:
        raw = np.frombuffer(data, dtype=np.uint8)
        opens = np.flatnonzero((raw | 0x20) == ord("{"))  # "[" is 0x5B, "{" 0x7B
        newlines = np.flatnonzero(raw == ord("\n")) if opens.size + self.carry > self.limit or self.keys else \
            np.array([data.rfind(b"\n")] if b"\n" in data else [], dtype=np.int64)
        before = np.searchsorted(opens, newlines)  # opens before each newline
        if newlines.size:
            lines = np.diff(before, prepend=0)
            lines[0] += self.carry
            most, self.carry = int(lines.max()), int(opens.size - before[-1])
        else:
            most, self.carry = 0, self.carry + int(opens.size)
        if max(most, self.carry) > self.limit:
            raise LabelDPError(f"an NDJSON line holds more than {self.limit} opening brackets; its rows are flat "
                               "objects", code=ErrorCode.MALFORMED_FILE)
        if self.keys is not None:  # keys (their colons, inside strings too) per line, counted alike
            colons = np.flatnonzero(raw == ord(":"))
            lines = np.searchsorted(colons, newlines) if newlines.size else np.empty(0, dtype=np.int64)
            counts = np.diff(lines, prepend=0)
            if counts.size:
                counts[0] += self.colons
                self.colons = int(colons.size - lines[-1])
            else:
                self.colons += int(colons.size)
            if max(int(counts.max(initial=0)), self.colons) > self.keys:
                raise LabelDPError(f"an NDJSON line holds more than {self.keys} keys; its rows are flat objects of "
                                   "the columns read", code=ErrorCode.MALFORMED_FILE)

    def tell(self) -> int:
        return self.raw.tell()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


def _matrix(batch: pa.RecordBatch) -> np.ndarray:
    """The batch's columns as a float64 matrix (rows × columns), nulls NaN: one conversion for numeric columns (one
    per column took 16 µs, 1.6 s for 100,000 classes)."""
    if all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in batch.schema.types):
        return np.asarray(batch.to_tensor(null_to_nan=True, row_major=True), dtype=np.float64)
    return np.column_stack([_floats(column) for column in batch.columns])


def _floats(column: pa.Array) -> np.ndarray:
    if pa.types.is_dictionary(column.type):  # numbers written as strings: the dictionary converted, then indexed
        return pc.cast(column.dictionary, pa.float64()).to_numpy(zero_copy_only=False)[
            column.indices.to_numpy(zero_copy_only=False)] if column.null_count == 0 else \
            _floats(column.dictionary.take(column.indices))
    return pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False)


class Memo:
    """One value per dictionary: the batches of a Parquet row group share their dictionary, converted once."""

    def __init__(self):
        self.key: tuple | None = None
        self.value = None
        self.dictionary: pa.Array | None = None

    def get(self, dictionary: pa.Array, convert):
        buffers = [b for b in dictionary.buffers() if b is not None]
        key = (len(dictionary), *((b.address, b.size) for b in buffers))
        if key != self.key:
            # the dictionary is kept: while it lives no other can take its buffers' addresses (issue 40's twentieth
            # review: a freed dictionary's successor at the same address got its codes — 979,000 of 10⁶ rows of a
            # group body in the wrong group)
            self.key, self.value, self.dictionary = key, convert(dictionary), dictionary
        return self.value


INTEGER_DIGITS = 20  # an int64 or uint64 written in decimal: at most 20 characters with its sign


# An id's bytes are counted ASCII_ID_WEIGHT times, or WIDE_ID_WEIGHT times outside ASCII: Python holds a string at
# up to four bytes a character, and the ids are copied about three times on their way to the lookup (issue 40's
# eighteenth review: 22,000 ids of 4,000 bytes, counted at 88 MB, took +426 MB when ASCII and +702 MB with one
# character outside the BMP; the nineteenth: 5.5 bytes a character of 64-byte ids).
ASCII_ID_WEIGHT, WIDE_ID_WEIGHT = 6, 10


def held_id_bytes(strings: pa.Array) -> pa.Array:
    """What each id of ``strings`` (valid UTF-8 strings) is counted as it is held, id by id as
    :func:`held_id_size` counts one (see :data:`ASCII_ID_WEIGHT`)."""
    weights = pc.if_else(pc.string_is_ascii(strings), ASCII_ID_WEIGHT, WIDE_ID_WEIGHT)
    return pc.multiply(pc.binary_length(strings), weights)


def held_id_size(value: str) -> int:
    """:func:`held_id_bytes` of one id."""
    return len(value.encode("utf-8")) * (ASCII_ID_WEIGHT if value.isascii() else WIDE_ID_WEIGHT)


def _id_strings(column: pa.Array, decoded: Decoded) -> list[str]:
    """The ids as Python strings, counted in ``decoded`` as they will be held (:func:`held_id_bytes`) before the
    Python strings are made: a dictionary column's rows name one entry each; ids of any other type (numbers,
    timestamps: an NDJSON body's) are counted as the text they become."""
    if pa.types.is_dictionary(column.type):  # its entries made strings and counted once per dictionary
        entries, held = decoded.lengths.get(column.dictionary, _entries_held)
        decoded.add(strings=int(pc.sum(held.take(column.indices)).as_py() or 0))
        return entries.take(column.indices).to_pylist()
    if pa.types.is_integer(column.type):
        decoded.add(strings=ASCII_ID_WEIGHT * INTEGER_DIGITS * len(column))
        return _strings(column).to_pylist()
    strings = _strings(column)
    decoded.add(strings=int(pc.sum(held_id_bytes(strings)).as_py() or 0))
    return strings.to_pylist()


def _entries_held(dictionary: pa.Array) -> tuple[pa.Array, pa.Array]:
    """A dictionary's entries as strings, and what each is counted as held."""
    entries = _strings(dictionary)
    return entries, held_id_bytes(entries)


class _Groups:
    """Each row's group name, as references to one string per group: a column of names is never expanded (a
    fixed-width array of them took rows x the longest name x 4 bytes — 8.7 GB from a 2 MB Parquet body whose
    dictionary held a thousand 900-character names)."""

    def __init__(self, decoded: Decoded):
        self.decoded, self.memo = decoded, Memo()
        self.index: dict[str, int] = {}
        self.codes: list[np.ndarray] = []

    def add(self, column: pa.Array) -> None:
        if column.null_count:
            raise LabelDPError("a group is missing", code=ErrorCode.MALFORMED_FILE)
        if not pa.types.is_dictionary(column.type):
            column = pc.cast(column, pa.string()).dictionary_encode()  # as large as the batch that carried it
        codes = self.memo.get(column.dictionary, self._codes)
        self.codes.append(codes[np.asarray(column.indices.to_numpy(zero_copy_only=False), dtype=np.int64)])

    def _codes(self, dictionary: pa.Array) -> np.ndarray:
        names = _strings(dictionary).to_pylist()
        if max(map(len, names), default=0) > MAX_GROUP_NAME:
            raise LabelDPError(f"group names are at most {MAX_GROUP_NAME} characters", code=ErrorCode.MALFORMED_FILE)
        for name in names:
            if name not in self.index:
                self.index[name] = len(self.index)
                self.decoded.add(strings=ID_ROW_BYTES + held_id_size(name))  # as an id is held (the twentieth
                # review: 980,000 names outside the BMP counted by characters took 2.2 times their count)
        return np.fromiter((self.index[name] for name in names), dtype=np.int64, count=len(names))

    def of_rows(self) -> np.ndarray:
        if not self.codes:
            return np.array([], dtype=object)
        return np.array(list(self.index), dtype=object)[np.concatenate(self.codes)]


@contextlib.contextmanager
def _parsing(what: str):
    """A body Arrow cannot read or convert is a 400 that says what is wrong with it (never a 500); the service
    running out of disk, memory or descriptors meanwhile is not the body's fault (507/503)."""
    try:
        yield
    except LabelDPError:
        raise
    except (pa.ArrowException, OSError, ValueError, ArithmeticError, csv.Error) as err:
        # UnicodeDecodeError is a ValueError; OverflowError (an ArithmeticError): a 401-digit prior as a float;
        # csv.Error: a field over the csv module's 131,072 characters, in a header or a wide prior's row
        raise resource_error(err) or LabelDPError(f"cannot parse {what}: {library_message(err)}",
                                                  code=ErrorCode.MALFORMED_FILE) from None


def _strings(column) -> pa.Array:
    """As strings, checked to be valid UTF-8 (Arrow's JSON reader does not check)."""
    strings = pc.cast(column, pa.string())
    strings.validate(full=True)
    return strings
