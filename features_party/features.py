"""Feature tables and their preprocessing (fitted on training features only; saved with the model)."""

from __future__ import annotations

import contextlib
import csv
import io
import math
import mmap
import os
import re
import secrets
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shared import parquet_pages
from shared.errors import ErrorCode, LabelDPError, library_message, resource_error

ID = "example_id"


def read_features(path: str | Path, what: str = "features") -> pd.DataFrame:
    """A features CSV (or another CSV keyed by example id: ``what`` names it in messages) with an ``example_id``
    column and unique ids."""
    try:
        with open(path, "rb") as handle:  # a handle, not the path: no library message can name the spooled file
            frame = pd.read_csv(handle, dtype={ID: str}, keep_default_na=True)
    except (ValueError, OSError) as err:  # pandas' ParserError, EmptyDataError and UnicodeDecodeError among them
        raise resource_error(err) or LabelDPError(f"cannot parse {what} file: {library_message(err)}",
                                                  code=ErrorCode.MALFORMED_FILE) from None
    return check_features(frame, what)


def store_frame(directory: Path, name: str, frame: pd.DataFrame) -> Path:
    """``frame`` (keyed by example id) as ``directory/name.parquet``, replaced at once: a reader sees the old file or
    the new one, never half of one."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{name}.parquet"
    staged = directory / f".{name}.{uuid.uuid4().hex}.tmp"  # collected at startup if a crash leaves it
    frame.reset_index(drop=True).to_parquet(staged, index=False)
    staged.replace(target)
    return target


def check_features(frame: pd.DataFrame, what: str = "features") -> pd.DataFrame:
    if ID not in frame.columns:
        raise LabelDPError(f"the {what} file needs an {ID!r} column", code=ErrorCode.MALFORMED_FILE)
    if frame[ID].isna().any():
        raise LabelDPError("an example_id is missing", code=ErrorCode.MALFORMED_FILE)
    frame = frame.assign(**{ID: frame[ID].astype(str)})
    duplicated = frame[ID].duplicated()
    if duplicated.any():
        raise LabelDPError(f"duplicate example_id {frame[ID][duplicated].iloc[0]!r} in {what}",
                           code=ErrorCode.DUPLICATE_EXAMPLE_ID)
    return frame.set_index(ID, drop=False)


# -- uploads: a features CSV stored in bounded memory (issue 40) --------------------------------------------------
#
# An upload is read by pandas (its types are the stored table's: preprocessing and a model's vocabularies follow
# them) in chunks of the rows pandas' own reader infers types over (``low_memory``, its default), each converted
# and written as it comes, into row groups of at most ROW_GROUP_ROWS rows and about ROW_GROUP_BYTES: an upload holds
# a chunk and a row group in memory whatever its size (a 60 MB CSV of short rows read whole, then stored, took the
# trainer up by 1.16 GB). The stored table is the one a whole read stores: a column whose chunks pandas typed
# differently (integers, then a chunk with a missing value) takes the type pandas gives their concatenation, and
# the file is then written again with it (a second pass, only then). Its ids are checked for duplicates out of core
# (:class:`_Ids`); what is refused, and with which code, is what :func:`read_features` refuses.

CHUNK_BYTES = 8 << 20  # bytes of the body per chunk read, about (at least pandas' own chunk: see _chunk_rows) ...
CHUNK_CELLS = 1 << 22  # ... and at most these cells
HASH_ROWS = 1 << 16  # ids made Python strings at once, to be hashed
ROW_GROUP_ROWS = 1 << 20  # pyarrow's default: the row groups to_parquet wrote
ROW_GROUP_BYTES = 32 << 20  # Arrow bytes buffered before they are written as a row group
PART_ROWS = 1 << 19  # ids per spill partition of the duplicate check (16 bytes each on disk, ~40 when sorted)
VERIFY_GROUPS = 256  # groups of equal hashes whose ids are read again at once to compare them as strings
ID_ROWS = 1 << 16  # rows per chunk when the ids alone are read again


@dataclass(frozen=True)
class StoredTable:
    file: Path
    num_examples: int
    columns: list[str]


@dataclass(frozen=True)
class CsvLimits:
    """What a CSV body may hold, checked on its bytes before it is parsed (413 ``body_too_large``)."""

    max_record_bytes: int
    max_columns: int

    @classmethod
    def of(cls, settings) -> CsvLimits:
        """A trainer's (``max_csv_record_bytes``, ``max_feature_columns`` of its settings)."""
        return cls(settings.max_csv_record_bytes, settings.max_feature_columns)

    def check(self, path: Path, what: str, max_columns: int | None = None) -> Records:
        """The body's :class:`Records`, and its header's names read from its first record (``max_columns``: fewer
        than this trainer's, e.g. an id list's one) — all before pandas reads it, which takes ~0.1 ms a column
        and memory for a header alone, and time quadratic in names repeated (the twelfth review: a 1 MiB header of
        commas, +4.2 GB and 118 s of CPU before its 413; 60,000 names "a", 37 s)."""
        records = scan_records(path)
        if records.misquoted:
            raise LabelDPError(f"the {what} file has a quote inside an unquoted field: quote whole fields and "
                               'double the quotes inside them ("5""")', code=ErrorCode.MALFORMED_FILE)
        if records.longest > self.max_record_bytes:
            raise LabelDPError(f"the {what} file has a record (a row, its quoted line breaks included) of "
                               f"{records.longest:,} bytes, over this trainer's {self.max_record_bytes:,} "
                               "(max_csv_record_bytes)", code=ErrorCode.BODY_TOO_LARGE)
        names = _header(path, self.max_record_bytes, what)
        limit = self.max_columns if max_columns is None else min(max_columns, self.max_columns)
        if len(names) > limit:
            if max_columns is not None:  # the body's kind has that many columns
                raise LabelDPError(f"the {what} file has {len(names):,} columns; it has at most {limit:,}",
                                   code=ErrorCode.MALFORMED_FILE)
            raise LabelDPError(f"the {what} file has {len(names):,} columns, over this trainer's {limit:,} "
                               "(max_feature_columns)", code=ErrorCode.BODY_TOO_LARGE)
        seen: set[str] = set()
        for name in names:  # pandas renames a repeated name (a.1, a.2, …): refused rather than guessed at
            if name and name in seen:
                raise LabelDPError(f"the {what} file names column {name[:80]!r} more than once",
                                   code=ErrorCode.MALFORMED_FILE)
            seen.add(name)
        return records


_BLANK_LINES = re.compile(rb"(?:[ \t]*(?:\r\n|\r|\n))*")  # what pandas skips before a header (skip_blank_lines)


def _header(path: Path, max_record_bytes: int, what: str) -> list[str]:
    """The names of the header pandas will read in the CSV at ``path`` — its first record after a byte-order mark
    and any lines of nothing but spaces and tabs (pandas skips them: the review of the twelfth round's fixes put a
    blank line before 200,000 names, +1.9 GB and 75 s) — as the csv module reads them (a quoted name may hold
    commas and line breaks). A record is at most ``max_record_bytes`` (checked before)."""
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if \
            os.fstat(handle.fileno()).st_size else contextlib.nullcontext(b"") as body:
        start = 3 if body[:3] == b"\xef\xbb\xbf" else 0
        match = _BLANK_LINES.match(body, start)
        start = match.end() if match else start
        raw = body[start:start + max_record_bytes + 4]
    try:  # undecodable bytes are pandas' to refuse; here they only need to count as characters
        return next(csv.reader(io.StringIO(raw.decode("utf-8", errors="replace"), newline="")), [])
    except csv.Error as err:
        raise LabelDPError(f"the {what} file's header cannot be read: {err}", code=ErrorCode.MALFORMED_FILE) from None


def store_features(path: Path, directory: Path, name: str, limits: CsvLimits, what: str = "features",
                   records: Records | None = None) -> StoredTable:
    """The features CSV at ``path`` (checked as :func:`read_features` checks it: 400 ``malformed_file`` or
    ``duplicate_example_id``, before anything is stored; within ``limits``: 413 ``body_too_large``) as
    ``directory/name.parquet`` — what :func:`store_frame` stores of :func:`read_features`' frame — replaced at
    once, read and written in bounded memory. Scratch files go beside ``path`` (a request's spooled body: its
    directory is the request's). ``records``: what ``limits.check`` found, when the caller checked already."""
    records = limits.check(path, what) if records is None else records
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{name}.parquet"
    staged = directory / f".{name}.{uuid.uuid4().hex}.tmp"  # collected at startup if a crash leaves it
    try:
        with tempfile.TemporaryDirectory(prefix="ids-", dir=Path(path).parent) as spill:
            rows, columns = _convert(Path(path), staged, Path(spill), what, records.lines, records.longest,
                                     records.long_bytes)
        staged.replace(target)
    except _WriteFailed as failure:
        staged.unlink(missing_ok=True)
        raise resource_error(failure.error) or failure.error from None
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    return StoredTable(target, rows, columns)


def _convert(path: Path, staged: Path, spill: Path, what: str, lines: int, longest: int,
             long_bytes: int) -> tuple[int, list[str]]:
    """One pass reads, checks and writes; a second writes again if a column's type changed after its first chunk.
    ``lines``: the body's (:class:`Records`)."""
    with _parsing(what):
        with open(path, "rb") as handle:  # a handle, not the path: no library message can name the spooled file
            # (at most max_feature_columns, none repeated: CsvLimits.check read the header first)
            columns = [str(c) for c in pd.read_csv(handle, dtype={ID: str}, nrows=0).columns]
        if ID not in columns:
            raise LabelDPError(f"the {what} file needs an {ID!r} column", code=ErrorCode.MALFORMED_FILE)
        chunk_rows = _chunk_rows(len(columns), path.stat().st_size / lines, longest, long_bytes)
        ids, types = _Ids(spill, lines), _Types(columns)
        writer: _Staged | None = None
        writing, chunks = True, 0
        try:
            for chunk in _chunks(path, chunk_rows):
                chunks += 1
                typed = types.add(chunk)
                if types.missing[columns.index(ID)]:
                    raise LabelDPError("an example_id is missing", code=ErrorCode.MALFORMED_FILE)
                ids.add(chunk[ID])
                if writing and (typed is None or not ids.complete):
                    writing = False  # written again with the whole table's types, or refused
                if writing:
                    try:
                        table = pa.Table.from_pandas(typed, preserve_index=False)
                    except (pa.ArrowException, ValueError, TypeError, OverflowError):
                        writing = False  # the whole table's types may hold it; if not, the second pass says so
                        continue
                    if writer is None:
                        writer = _Staged(staged, table.schema)
                    if table.schema.equals(writer.schema):
                        writer.add(table)
                    else:
                        writing = False
            duplicate = ids.first_duplicate(lambda rows: _ids_at(path, columns.index(ID), rows, chunk_rows))
            if duplicate is not None:
                raise LabelDPError(f"duplicate example_id {duplicate!r} in {what}", code=ErrorCode.DUPLICATE_EXAMPLE_ID)
            if writing and writer is not None and (chunks == 1 or writer.schema.equals(
                    types.schema(what), check_metadata=True)):
                writer.close()  # the common case: every chunk typed as the first
                return ids.rows, columns
        finally:
            if writer is not None:
                writer.discard()
        schema, dtypes = types.schema(what), types.unified()
        writer = _Staged(staged, schema)
        try:
            for chunk in _chunks(path, chunk_rows):
                cast = {c: dtypes[c] for c, dtype in chunk.dtypes.items() if dtypes[c] != dtype}
                try:
                    table = pa.Table.from_pandas(chunk.astype(cast), schema=schema, preserve_index=False)
                except (pa.ArrowException, ValueError, TypeError, OverflowError) as err:
                    raise _unstorable(what, err) from None
                writer.add(table)
            writer.close()
        finally:
            writer.discard()
    return ids.rows, columns


def _chunks(path: Path, rows: int) -> Iterator[pd.DataFrame]:
    with open(path, "rb") as handle, pd.read_csv(handle, dtype={ID: str}, keep_default_na=True,
                                                 chunksize=rows) as reader:
        yield from reader


CHUNK_MAX_BYTES = 16 << 20  # a chunk's rows at their longest (the body's longest record) hold at most this
LONG_RECORD = 4 << 10  # a record longer than this is counted apart (Records.long_bytes)


def _chunk_rows(columns: int, row_bytes: float, longest: int = 0, long_bytes: int | None = None) -> int:
    """Rows per chunk: a multiple of the rows pandas' reader infers types over at once (``low_memory``, its
    default: the largest power of two under half of 2²⁰ cells / columns), so that each chunk is typed as a whole
    read types those rows, of about :data:`CHUNK_BYTES` of the body (rows of ``row_bytes``) and at most
    :data:`CHUNK_CELLS` cells when that is more than pandas' chunk (pandas spends ~0.2 ms per column on a chunk:
    60 MB of 2,000 columns took 27 s to read in chunks of 512 rows, 8.5 s in chunks of 2,048). But never more rows
    than :data:`CHUNK_MAX_BYTES` holds of the ``longest`` record (the review of the twelfth round's fixes: 300 rows
    of 1 MB were one chunk, +1,388 MB): a body of long records is read in smaller chunks than pandas' own, and
    their types unified as any chunks' are — unless its records longer than :data:`LONG_RECORD` (``long_bytes``
    all together) fill at most half a chunk: then a chunk of R rows holds at most R short records and all the long
    ones, and R short records may fill the other half."""
    heuristic, rows = (1 << 20) // max(1, columns), 1
    while rows * 2 < heuristic:
        rows *= 2
    rows *= max(1, min(int(CHUNK_BYTES // max(1.0, rows * row_bytes)), CHUNK_CELLS // (rows * max(1, columns))))
    bound = max(1, CHUNK_MAX_BYTES // max(1, longest))
    if long_bytes is not None and long_bytes <= CHUNK_MAX_BYTES // 2:
        # the long records all together fit half a chunk: R rows hold at most R short ones and all the long ones
        # (the fourteenth review: one 530 KB cell among 42,000 short rows made 2,600 chunks, 3.5 s of CPU)
        bound = max(bound, CHUNK_MAX_BYTES // 2 // LONG_RECORD)
    while rows > bound:
        rows //= 2
    return rows


@dataclass(frozen=True)
class Records:
    """What a CSV body's bytes say of its records before it is parsed: its lines, ended by \\n, \\r\\n or a lone
    \\r (pandas reads all three, and a body may mix them: counting \\n alone put a \\r-ended body's every row in
    one partition of the duplicate check, read whole — 602 MB for 120 MB — and let an id list of 7.5 million
    \\r-ended ids past its limit of a million: +1,175 MB), and its longest record in bytes (a quoted field may hold
    line breaks: a record ends at a line break outside quotes). Issue 40's eleventh review: one 200 MB cell, or 10⁸
    quoted line breaks, was read whole (+1,219 MB)."""

    lines: int
    longest: int
    misquoted: bool = False  # a quote that opens a field where no field starts (see scan_records)
    long_bytes: int = 0  # the bytes of the records longer than LONG_RECORD, all together


_FIELD_STARTS = np.frombuffer(b',\n\r"', dtype=np.uint8)  # what may precede a field's opening quote


def scan_records(path: Path, piece: int = 1 << 20) -> Records:
    """:class:`Records` of the body at ``path``, read in pieces (vectorized: memory linear in a piece)."""
    newlines = returns = pairs = quotes = longest = long_bytes = 0
    start = 0  # where the record being read began
    offset, previous = 0, ord("\n")  # the byte before the piece (the file starts a field)
    misquoted = False
    with open(path, "rb") as handle:
        marked = handle.read(3) == b"\xef\xbb\xbf"
        handle.seek(0)
        for block in iter(lambda: handle.read(piece), b""):
            data = np.frombuffer(block, dtype=np.uint8)
            newlines += block.count(b"\n")
            returns += block.count(b"\r")
            # \r\n is one line break, also across pieces (the review of the twelfth round: records ending by
            # turns in a lone \r and a lone \n were counted at half, 2·10⁶ ids past a limit of 10⁶)
            pairs += block.count(b"\r\n") + int(previous == ord("\r") and block[:1] == b"\n")
            is_quote = data == ord('"')
            # quotes before each byte (a doubled quote inside a field counts twice: its parity is unchanged)
            before = quotes + np.cumsum(is_quote) - is_quote
            # Parity is the reader's state only if every quote it takes for an opening one starts a field (or
            # doubles a quote): pandas reads a quote inside an unquoted field as a character, so `a"b,"…"` would
            # hide a long quoted field from a count of quotes alone. Such a body is refused (writers quote whole
            # fields and double inner quotes: RFC 4180).
            opening = np.flatnonzero(is_quote & (before % 2 == 0))
            prior = np.where(opening > 0, data[np.maximum(opening - 1, 0)], previous)
            if marked:  # a byte-order mark: the first field starts after it
                prior = np.where(opening + offset == 3, ord("\n"), prior)
            misquoted = misquoted or not bool(np.isin(prior, _FIELD_STARTS).all())
            ends = np.flatnonzero(((data == ord("\n")) | (data == ord("\r"))) & (before % 2 == 0)) + offset
            if len(ends):
                gaps = ends - np.concatenate(([start], ends[:-1] + 1))  # each record's bytes, its break left out
                longest, start = max(longest, int(gaps.max())), int(ends[-1]) + 1
                long_bytes += int(gaps[gaps > LONG_RECORD].sum())
            quotes += int(np.count_nonzero(is_quote))
            offset, previous = offset + len(block), int(data[-1])
    last = offset - start  # the record the body ends with, unbroken
    return Records(1 + newlines + returns - pairs, max(longest, last), misquoted,
                   long_bytes + (last if last > LONG_RECORD else 0))


@contextlib.contextmanager
def _parsing(what: str):
    """A body pandas cannot read is a 400 that says what is wrong with it (never a 500); the service running out of
    disk, memory or descriptors meanwhile is not the body's fault (507/503)."""
    try:
        yield
    except (LabelDPError, _WriteFailed):
        raise
    except (ValueError, OSError) as err:  # pandas' ParserError, EmptyDataError and UnicodeDecodeError among them
        raise resource_error(err) or LabelDPError(f"cannot parse {what} file: {library_message(err)}",
                                                  code=ErrorCode.MALFORMED_FILE) from None


class _WriteFailed(Exception):
    """Writing the stored table failed (the service's fault, not the body's): ``error`` is raised as it is, or
    as the resource that ran out."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class _Types:
    """Each column's pandas dtypes over the chunks so far. A chunk typed as the first is handed on as it is; one that
    pandas' reader would cast to the first's types (a float column, then a chunk of integers) is handed on cast;
    otherwise (None) the stored table is written again with :meth:`unified` types and :meth:`schema`. Per dtype met
    in a column: one value of it (strings cut to a character) and whether values were missing — what decides the
    type of the column read whole, and the Arrow type of an object column (inferred from its values' Python types).
    """

    FLOAT = np.dtype("float64")

    def __init__(self, columns: list[str]):
        self.columns = columns
        self.first: list[Any] = []
        self.seen: list[dict[Any, tuple[Any, bool]]] = [{} for _ in columns]  # dtype -> (a value or None, missing)
        self.empty = [False] * len(columns)  # a chunk held no value of the column
        self.missing = np.zeros(len(columns), dtype=bool)  # the last chunk's columns with a missing value

    def add(self, chunk: pd.DataFrame) -> pd.DataFrame | None:
        dtypes = list(chunk.dtypes)
        missing = chunk.isna()
        self.missing = missing.any().to_numpy()  # this chunk's columns with a missing value
        empty = missing.all().to_numpy() & (len(chunk) > 0)
        for index, dtype in enumerate(dtypes):
            seen = self.seen[index]
            if empty[index] and dtype == self.FLOAT:  # how pandas types a chunk of no value
                self.empty[index] = True
                continue
            value, was_missing = seen.get(dtype, (None, False))
            if value is None and not empty[index] and len(chunk):
                values = chunk.iloc[:, index]
                value = values.loc[values.first_valid_index()]
                value = value[:1] if isinstance(value, str) else value
            seen[dtype] = (value, bool(was_missing or self.missing[index] or not len(chunk)))
        if not self.first:
            self.first = dtypes
        if dtypes == self.first:
            return chunk
        cast = {}
        for index, (column, dtype, first) in enumerate(zip(chunk.columns, dtypes, self.first, strict=True)):
            if dtype != first:
                if self._column(index).dtype != first:
                    return None
                cast[column] = first
        return chunk.astype(cast)

    def _column(self, index: int) -> pd.Series:
        """A few values standing for the column read whole: one per dtype met (and a missing value where one was),
        concatenated as pandas' reader concatenates its chunks — but a chunk of no value (float64, read alone) is
        read as strings beside chunks of strings, as pandas' reader reads it whole."""
        seen = dict(self.seen[index])
        if self.empty[index]:
            strings = [dtype for dtype in seen if isinstance(dtype, pd.StringDtype)]
            for dtype in strings or [self.FLOAT]:
                seen[dtype] = (seen.get(dtype, (None, True))[0], True)
        return _concatenated([pd.Series(([] if value is None else [value]) + ([np.nan] if missing else []),
                                        dtype=dtype) for dtype, (value, missing) in seen.items()])

    def unified(self) -> dict[str, Any]:
        """The dtype of each column read whole."""
        return {column: self._column(i).dtype for i, column in enumerate(self.columns)}

    def schema(self, what: str) -> pa.Schema:
        """The Arrow schema (pandas' metadata included) of the table read whole, from a few values of each column;
        a column whose chunks hold values Arrow cannot store in one column (numbers, then text) is refused (400)."""
        parts = [self._column(i) for i in range(len(self.columns))]
        rows = max((len(p) for p in parts), default=0)
        frame = pd.DataFrame({column: p.iloc[np.minimum(np.arange(rows), len(p) - 1)].reset_index(drop=True)
                              for column, p in zip(self.columns, parts, strict=True)})
        try:
            return pa.Schema.from_pandas(frame, preserve_index=False)
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as err:
            raise _unstorable(what, err) from None


def _unstorable(what: str, err: BaseException) -> LabelDPError:
    return LabelDPError(f"cannot store the {what} file: a column holds values of different kinds in different rows "
                        f"(numbers and text, say): {library_message(err)}", code=ErrorCode.MALFORMED_FILE)


def _concatenated(parts: list[pd.Series]) -> pd.Series:
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]


class _Staged:
    """The stored table being written (pyarrow's defaults: what to_parquet writes), Arrow tables buffered into row
    groups. Failures to write are :class:`_WriteFailed`: the service's, not the body's."""

    def __init__(self, file: Path, schema: pa.Schema):
        self.schema = schema
        try:
            self.writer: pq.ParquetWriter | None = pq.ParquetWriter(file, schema)
        except Exception as err:
            raise _WriteFailed(err) from err
        self.buffered: list[pa.Table] = []
        self.rows = self.bytes = 0

    def add(self, table: pa.Table) -> None:
        self.buffered.append(table)
        self.rows, self.bytes = self.rows + table.num_rows, self.bytes + table.nbytes
        if self.rows >= ROW_GROUP_ROWS or self.bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self.buffered:
            return
        table = pa.concat_tables(self.buffered) if len(self.buffered) > 1 else self.buffered[0]
        self.buffered, self.rows, self.bytes = [], 0, 0
        assert self.writer is not None
        try:
            self.writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
        except Exception as err:
            raise _WriteFailed(err) from err

    def close(self) -> None:
        self._flush()
        if self.writer is not None:
            writer, self.writer = self.writer, None
            try:
                writer.close()
            except Exception as err:
                raise _WriteFailed(err) from err

    def discard(self) -> None:
        """Closed without its buffered rows (the file is written again, or the upload refused)."""
        self.buffered = []
        if self.writer is not None:
            writer, self.writer = self.writer, None
            with contextlib.suppress(Exception):
                writer.close()


class _Ids:
    """An upload's example ids, checked for a duplicate out of core. Each chunk's ids are hashed (Python's string
    hash, keyed at random per process) and a chunk's own repeat found at once (rows after it are not recorded: the
    upload is refused); (hash, row) records are appended to spill files, partitioned by the hash under a key drawn
    per upload (a partition holds about :data:`PART_ROWS` records: it is sorted alone). Ids of equal hashes are read
    again from the body and compared as strings, so the duplicate named is pandas' (the first row whose id an
    earlier row has)."""

    RECORD = np.dtype([("hash", "<i8"), ("row", "<i8")])
    HASH: Callable[[str], int] = hash  # a builtin: not bound as a method

    def __init__(self, spill: Path, lines: int):
        self.spill = spill
        self.bits = max(0, math.ceil(math.log2(max(1, lines) / PART_ROWS)))
        self.key = np.uint64(secrets.randbits(64) | 1)
        self.rows = 0
        self.complete = True  # False once a chunk repeated an id: later rows are not recorded

    def add(self, ids: pd.Series) -> None:
        if self.complete and len(ids):
            hashes = np.concatenate([np.fromiter(map(self.HASH, ids.iloc[start:start + HASH_ROWS].tolist()),
                                                 dtype=np.int64) for start in range(0, len(ids), HASH_ROWS)])
            repeat = _first_repeat(ids, hashes)
            if repeat is not None:
                hashes, self.complete = hashes[:repeat + 1], False
            records = np.empty(len(hashes), self.RECORD)
            records["hash"], records["row"] = hashes, np.arange(self.rows, self.rows + len(hashes))
            parts = self._parts(hashes)
            order = np.argsort(parts, kind="stable")
            records, parts = records[order], parts[order]
            edges = np.searchsorted(parts, np.arange((1 << self.bits) + 1))
            for part in np.flatnonzero(np.diff(edges)):
                with open(self.spill / str(part), "ab") as out:
                    out.write(records[edges[part]:edges[part + 1]].tobytes())
        self.rows += len(ids)

    def _parts(self, hashes: np.ndarray) -> np.ndarray:
        if not self.bits:
            return np.zeros(len(hashes), dtype=np.int64)
        return ((hashes.view(np.uint64) * self.key) >> np.uint64(64 - self.bits)).astype(np.int64)

    def first_duplicate(self, strings: Callable[[set[int]], dict[int, str]]) -> str | None:
        """The id of the first row whose id an earlier row has (None: no row's); ``strings(rows)`` reads those rows'
        ids from the body. Groups of equal hashes are compared by their second rows' order, :data:`VERIFY_GROUPS`
        at a time, until the first repeat found comes before any group left (a hash collision is no repeat)."""
        after, best = -1, None
        while True:
            groups, bound = self._groups(after)
            if not groups:
                return None if best is None else best[1]
            texts = strings({int(row) for _, rows in groups for row in rows})
            for _, rows in groups:
                seen: set[str] = set()
                for row in rows:
                    text = texts[int(row)]
                    if text in seen:
                        if best is None or row < best[0]:
                            best = (int(row), text)
                        break
                    seen.add(text)
            if best is not None and (bound is None or best[0] < bound):
                return best[1]
            if bound is None:
                return None if best is None else best[1]
            after = groups[-1][0]

    def _groups(self, after: int) -> tuple[list[tuple[int, np.ndarray]], int | None]:
        """Up to :data:`VERIFY_GROUPS` groups of rows of equal hashes whose second row is after ``after``: (second
        row, rows), by second row; and the second row of the first group left out (None: none was)."""
        groups: list[tuple[int, np.ndarray]] = []
        bound: int | None = None
        for part in range(1 << self.bits):
            file = self.spill / str(part)
            if not file.exists():
                continue
            records = np.fromfile(file, dtype=self.RECORD)
            records = records[np.lexsort((records["row"], records["hash"]))]
            hashes, rows = records["hash"], records["row"]
            del records
            starts = np.flatnonzero(np.concatenate(([True], hashes[1:] != hashes[:-1])))
            sizes = np.diff(np.append(starts, len(hashes)))
            starts, sizes = starts[sizes > 1], sizes[sizes > 1]
            seconds = rows[starts + 1]
            keep = seconds > after
            starts, sizes, seconds = starts[keep], sizes[keep], seconds[keep]
            if len(seconds) > VERIFY_GROUPS:
                order = np.argpartition(seconds, VERIFY_GROUPS)
                left = int(seconds[order[VERIFY_GROUPS:]].min())
                bound = left if bound is None else min(bound, left)
                order = order[:VERIFY_GROUPS]
                starts, sizes, seconds = starts[order], sizes[order], seconds[order]
            groups.extend((int(second), rows[start:start + size].copy())
                          for second, start, size in zip(seconds, starts, sizes, strict=True))
            groups.sort(key=lambda group: group[0])
            if len(groups) > VERIFY_GROUPS:
                left = groups[VERIFY_GROUPS][0]
                bound = left if bound is None else min(bound, left)
                del groups[VERIFY_GROUPS:]
        return groups, bound


def _first_repeat(ids: pd.Series, hashes: np.ndarray) -> int | None:
    """The first position in ``ids`` whose id an earlier position has (None: none)."""
    ordered = np.sort(hashes)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if not repeated.size:
        return None
    seen: set[str] = set()
    positions = np.flatnonzero(np.isin(hashes, repeated))
    for position, text in zip(positions, ids.iloc[positions].tolist(), strict=True):
        if text in seen:
            return int(position)
        seen.add(text)
    return None


def _ids_at(path: Path, position: int, rows: set[int], chunk_rows: int = ID_ROWS) -> dict[int, str]:
    """The ids of ``rows`` (data rows, from 0), read again from the body, at most ``chunk_rows`` rows at a time."""
    wanted, start = np.array(sorted(rows), dtype=np.int64), 0
    found: dict[int, str] = {}
    with open(path, "rb") as handle, pd.read_csv(handle, dtype={ID: str}, usecols=[position], keep_default_na=True,
                                                 chunksize=min(ID_ROWS, chunk_rows)) as reader:
        for chunk in reader:
            values = chunk.iloc[:, 0].tolist()
            low, high = np.searchsorted(wanted, [start, start + len(values)])
            found.update((int(row), values[row - start]) for row in wanted[low:high])
            start += len(values)
            if start > wanted[-1]:
                break
    return found


@dataclass(frozen=True)
class Preprocessor:
    """Standardize numeric columns; map categorical values to 1..V (0 = unseen)."""

    numeric: tuple[str, ...]
    categorical: tuple[str, ...]
    means: tuple[float, ...] = ()
    stds: tuple[float, ...] = ()
    vocabularies: tuple[tuple[str, ...], ...] = field(default=())

    @staticmethod
    def check(frame: pd.DataFrame, numeric, categorical) -> None:
        """The columns exist and the numeric ones are numbers, on every row (what ``fit`` needs of any subset):
        a column at a time (the whole table's matrix is a copy of it: the twelfth review's job on 20,000 rows ×
        1,000 columns took +476 MB to check them)."""
        check_present(frame.columns, numeric, categorical)
        if "example_id" in tuple(numeric) + tuple(categorical):
            raise LabelDPError("example_id is the key, not a feature", code=ErrorCode.MALFORMED_FILE)
        bad = [c for c in numeric if _numeric_column(frame[c]) is None]
        if bad:
            raise _not_numbers(bad)

    @classmethod
    def fit(cls, frame: pd.DataFrame, numeric, categorical) -> Preprocessor:
        """Fitted on ``frame`` alone: pass the rows the model trains on (never held-out rows)."""
        numeric, categorical = tuple(numeric), tuple(categorical)
        cls.check(frame, numeric, categorical)
        values = _numeric(frame, numeric)
        means = values.mean(axis=0) if len(frame) else np.zeros(len(numeric))
        stds = values.std(axis=0) if len(frame) else np.ones(len(numeric))
        vocabularies = tuple(tuple(sorted(frame[c].astype(str).unique())) for c in categorical)
        return cls(numeric, categorical, tuple(float(m) for m in means),
                   tuple(float(s) if s > 0 else 1.0 for s in stds), vocabularies)

    @property
    def vocab_sizes(self) -> tuple[int, ...]:
        return tuple(len(v) + 1 for v in self.vocabularies)

    def transform(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        missing = [c for c in self.numeric + self.categorical if c not in frame.columns]
        if missing:
            raise LabelDPError(f"feature columns missing: {missing}", code=ErrorCode.MALFORMED_FILE)
        numeric = (_numeric(frame, self.numeric) - np.array(self.means)) / np.array(self.stds)
        # float32 for the learners: a row far outside the training rows' spread (1e60 against a standard deviation
        # of 1) must stay a large finite number, not become inf after the release was drawn
        numeric = np.clip(numeric, -FLOAT32_LIMIT, FLOAT32_LIMIT)
        categorical = np.zeros((len(frame), len(self.categorical)), dtype=np.int32)
        for i, (column, vocabulary) in enumerate(zip(self.categorical, self.vocabularies, strict=True)):
            lookup = {value: j + 1 for j, value in enumerate(vocabulary)}
            categorical[:, i] = frame[column].astype(str).map(lookup).fillna(0).to_numpy(dtype=np.int32)
        return numeric.astype(np.float32), categorical

    def to_dict(self) -> dict:
        return {"numeric": list(self.numeric), "categorical": list(self.categorical), "means": list(self.means),
                "stds": list(self.stds), "vocabularies": [list(v) for v in self.vocabularies]}

    @classmethod
    def from_dict(cls, data: dict) -> Preprocessor:
        return cls(tuple(data["numeric"]), tuple(data["categorical"]), tuple(data["means"]), tuple(data["stds"]),
                   tuple(tuple(v) for v in data["vocabularies"]))

    @classmethod
    def from_file(cls, data: Any, max_levels: int) -> Preprocessor:
        """From a model file, every field checked (ValueError or TypeError else): column names are strings, one
        mean and one standard deviation per numeric column, each a finite number (a string of a number is not one:
        it passed a float conversion and failed later), deviations positive, and each vocabulary at most
        ``max_levels`` distinct strings (padding one with duplicates made each categorical split list them)."""
        if not isinstance(data, dict) or set(data) != {"numeric", "categorical", "means", "stds", "vocabularies"}:
            raise ValueError("preprocessing fields")
        numeric, categorical = data["numeric"], data["categorical"]
        means, stds, vocabularies = data["means"], data["stds"], data["vocabularies"]
        lists = (numeric, categorical, means, stds, vocabularies)
        if not all(isinstance(x, list) for x in lists) or not all(isinstance(v, list) for v in vocabularies):
            raise TypeError("preprocessing lists")
        if not all(isinstance(n, str) for n in numeric + categorical) or len(means) != len(numeric) \
                or len(stds) != len(numeric) or len(vocabularies) != len(categorical):
            raise ValueError("preprocessing shapes")
        if not all(type(x) in (int, float) and math.isfinite(x) for x in means + stds) or any(x <= 0 for x in stds):
            raise ValueError("preprocessing numbers")
        for vocabulary in vocabularies:
            if len(vocabulary) > max_levels or not all(isinstance(x, str) for x in vocabulary) \
                    or len(set(vocabulary)) != len(vocabulary):
                raise ValueError("vocabularies")
        return cls.from_dict(data)


VALUE_BYTES = 16  # a fixed-width value read: Arrow's 8 bytes and pandas' 8 (measured: 13 with the allocator's)
STRING_BYTES = 64  # a string value's own cost in Arrow and pandas, its characters counted besides
# The page walk of a table this service wrote itself (not a body): up to 4,000 string columns × its row groups × two
# pages; ~5 s of header parsing at most
STORED_TABLE_PAGES = 1 << 20


def table_bytes(file: str | Path, columns: Sequence[str]) -> int:
    """What reading ``columns`` (and the ids) of a stored table, as ``planning.load_frame`` does, and checking them
    takes: :data:`VALUE_BYTES` a fixed-width value; :data:`STRING_BYTES` a string value and twice what its strings
    decode to — a wholly dictionary-encoded chunk row by row from its indices, any other its plain pages' bytes and,
    for its dictionary-encoded rows, the longest entry of its dictionary page. Pages alone understate it: the
    twelfth review's 1,000 columns of repeated zeros were counted 2.2 MB and took +886 MB; the next review's column
    of one 200 KB string named by 1,500 rows took +495 MB counted as 0.6 MB."""
    parquet = pq.ParquetFile(file)
    metadata = parquet.metadata
    positions = {metadata.schema.column(i).name: i for i in range(metadata.num_columns)}
    wanted = {positions[c] for c in [ID, *columns] if c in positions}
    strings = {i for i in wanted if metadata.schema.column(i).physical_type == "BYTE_ARRAY"}
    total = metadata.num_rows * (STRING_BYTES * len(strings) + VALUE_BYTES * (len(wanted) - len(strings)))
    size = os.path.getsize(file)
    budget = parquet_pages.WalkBudget(STORED_TABLE_PAGES, size)
    with open(file, "rb") as handle:
        for group in range(metadata.num_row_groups):
            for i in strings:
                pages = parquet_pages.column_chunk(handle, metadata.row_group(group).column(i), size, budget)
                name = metadata.schema.column(i).name
                if pages.dictionary and not pages.plain_values:  # each row's own entry, counted exactly
                    total += 2 * _dictionary_decoded(file, group, name)
                else:  # plain pages' bytes, and the first pages' dictionary-encoded rows at the longest entry
                    encoded = pages.values - pages.plain_values
                    longest = parquet_pages.longest_entry(pq.ParquetFile(file, read_dictionary=[name]), group,
                                                          name) if pages.dictionary and encoded else 0
                    total += 2 * (pages.uncompressed - pages.dictionary + encoded * longest)
    return total


def _dictionary_decoded(file: str | Path, group: int, column: str) -> int:
    """What the rows of a wholly dictionary-encoded chunk decode to as strings: each row's entry's bytes, read as a
    dictionary (its indices, 4 bytes a row, and its entries once: the fourteenth review's category of one 500 KB
    value among 40,000 rows of "a" was counted 40 GB at the longest entry a row)."""
    total, lengths, seen = 0, pa.array([], pa.int32()), None
    for batch in pq.ParquetFile(file, read_dictionary=[column]).iter_batches(batch_size=1 << 16, row_groups=[group],
                                                                            columns=[column]):
        values = batch.column(0)
        if not pa.types.is_dictionary(values.type):
            total += int(pc.sum(pc.binary_length(values)).as_py() or 0)
            continue
        if seen is None or len(values.dictionary) != len(seen) or not values.dictionary.equals(seen):
            seen, lengths = values.dictionary, pc.binary_length(values.dictionary)
        total += int(pc.sum(lengths.take(values.indices)).as_py() or 0)
    return total


def check_present(names, numeric, categorical) -> None:
    """400 ``malformed_file`` naming the job's feature columns that are not among ``names``."""
    missing = [c for c in (*numeric, *categorical) if c not in set(names)]
    if missing:
        raise LabelDPError(f"feature columns not in the features file: {missing}", code=ErrorCode.MALFORMED_FILE)


MAX_MAGNITUDE = 1e100  # a numeric feature's largest |value|: squares and sums of any table stay finite
FLOAT32_LIMIT = 1e30  # standardized values are clipped here: finite in float32, squares too


def _numeric(frame: pd.DataFrame, columns) -> np.ndarray:
    """The numeric columns as float64: every value a finite number of magnitude at most :data:`MAX_MAGNITUDE` —
    planning checks the whole table, so that standardizing any subset of its rows (after a release was drawn) is
    finite: an ``inf`` made the mean infinite and the trees' training fail after the charge."""
    array = np.empty((len(frame), len(columns)))  # filled a column at a time: no frame of them copied whole
    bad = []
    for j, column in enumerate(columns):
        values = _numeric_column(frame[column])
        if values is None:
            bad.append(column)
        else:
            array[:, j] = values
    if bad:
        raise _not_numbers(bad)
    return array


def _numeric_column(column: pd.Series) -> np.ndarray | None:
    """The column as float64 if every value is a finite number within ±:data:`MAX_MAGNITUDE`, else None."""
    values = pd.to_numeric(column, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    return values if bool((np.abs(values) <= MAX_MAGNITUDE).all()) else None


def _not_numbers(columns: list[str]) -> LabelDPError:
    return LabelDPError(f"non-numeric, missing or infinite values, or values beyond ±{MAX_MAGNITUDE:g}, in numeric "
                        f"column(s) {columns}", code=ErrorCode.MALFORMED_FILE)
