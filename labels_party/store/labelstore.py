"""Label versions and the example registry on disk, out of core: memory stays bounded whatever the dataset's size.

A **label version** is one Parquet file, ``registry_index, example_id, label``, sorted by ``registry_index``, in
row groups of :data:`BATCH_ROWS`; everything that reads labels iterates over its row groups. Beside it, the
version's **coverage** — its sorted registry indices as an ``.npy`` file, content-addressed by SHA-256 — is what
a release of the whole version charges (the ledger memory-maps it; a thousand releases of one version share it).

The **registry** gives every example id ever uploaded a stable index (budgets follow ids across versions). It is
not a structure of its own: the ids a version introduced are the rows of that version's file whose index lies in
``[registry_start, registry_end)``, so the registry is the union of those ranges (datasets written before this
layout were rewritten into it once: migration 0009).

Duplicate ids and the join of an upload against the registry run in DuckDB with a memory limit and a spill
directory under the data directory, never in Python structures. Memory stays bounded whatever the upload's or the
registry's size (issue 28, item 5: a second upload of 4·10⁶ 64-character ids ran out of DuckDB's 244 MiB):

* every query has one blocking operator (DuckDB spills each of its hash aggregate, hash join and sort, but a
  query stacking a join under a sort and a window, as the registry join did, can exhaust the limit between them):
  duplicates (aggregate), the join (written to a file), the sort by registry index (written to a file), then a
  streaming pass in Python numbers the new ids;
* the files DuckDB reads are written in row groups bounded in *bytes* (:data:`ROW_GROUP_BYTES`): its Parquet
  reader holds a whole column chunk per thread, and row groups of 2²⁰ rows held 68 MiB of 64-character ids;
* DuckDB runs one thread per 128 MB of ``LabelsSettings.upload_memory_mb`` (its documented minimum per thread; one
  thread below that, at most two);
* Python reads bodies and files through buffered streams in batches of :data:`PARSE_ROWS` rows.

DuckDB is used rather than a hand-written sort-merge: its out-of-core aggregate, join and sort are maintained and
tested at scales this service is not, and the fault was in how they were fed, not in them.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from labels_party.store.storage import DataStore, MappedArray, OutsideDataDirectory, write_npy
from labels_party.store.uploads import (
    EXTRA_KEYS,
    DepthLimited,
    Memo,
    parquet_batches,
    parquet_decoded,
    parquet_metadata,
    string_bytes,
)
from shared.domains import check_labels
from shared.errors import ErrorCode, LabelDPError, library_message, resource_error

BATCH_ROWS = 1 << 20
PARSE_ROWS = 1 << 16  # rows per batch where ids are in memory (64 Ki ids of 1 KB: 64 MB)
ROW_GROUP_BYTES = 4 << 20  # uncompressed bytes per row group of the files DuckDB reads
STREAM_BUFFER = 1 << 20  # Parquet is read through a buffer of this size (not a whole column chunk at once)
VERSION_SCHEMA = pa.schema([("registry_index", pa.int64()), ("example_id", pa.string()), ("label", pa.float64())])
DUCKDB_MEMORY_MB = 128  # LabelsSettings.upload_memory_mb by default
DUCKDB_MB_PER_THREAD = 128  # DuckDB's documented minimum per thread


@dataclass(frozen=True)
class RegistryPart:
    """Example ids a label version introduced: its rows with registry_index in [start, end); ``stamp``: its file's
    status when it was checked (:meth:`DataStore.stamp`), which must not have changed when what was read from it
    commits."""

    file: str
    start: int
    end: int
    stamp: tuple = ()


@dataclass(frozen=True)
class CoverageSet:
    """Sorted registry indices (int64 ``.npy``), content-addressed: ``sha256`` of their bytes. A request's
    coverage is ``pending`` until its charge: written to a scratch file, stored under ``file`` only by
    :func:`keep` in the charge's transaction, and removed by :func:`discard` if it is refused — a refused request
    leaves nothing in the data directory."""

    file: str
    sha256: str
    size: int
    pending: str | None = None  # the scratch file (relative) holding the indices until they are kept

    @property
    def readable(self) -> str:
        """Where the indices are now."""
        return self.pending or self.file


@dataclass(frozen=True)
class Ingested:
    file: str
    coverage: CoverageSet
    num_examples: int
    new_examples: int
    registry_start: int
    registry_end: int
    clipped_below: int
    clipped_above: int
    bulk: tuple[float, float] | None = None  # approximate 5th and 95th percentiles of the stored labels
    id_bytes: int = 0  # Σ of its example ids' UTF-8 bytes: what a release of it writes of them, labels aside


BULK_QUANTILES = (0.05, 0.95)  # the labels' bulk, set against the declared range (datasets.range_warning)


def duckdb_connection(store: DataStore, memory_mb: int = DUCKDB_MEMORY_MB) -> tuple[duckdb.DuckDBPyConnection, Path]:
    """An in-memory DuckDB with a memory limit, spilling under the data directory, with as many threads (at most
    2) as the limit gives DuckDB's minimum each."""
    # One spill directory per connection: concurrent DuckDB instances name their spill files alike.
    spill = store.path(f"tmp/duckdb-{uuid.uuid4().hex}")
    spill.mkdir(parents=True)
    threads = max(1, min(2, memory_mb // DUCKDB_MB_PER_THREAD))
    return duckdb.connect(config={"memory_limit": f"{int(memory_mb)}MB", "temp_directory": str(spill),
                                  "preserve_insertion_order": False, "threads": threads}), spill


# -- uploads ----------------------------------------------------------------------------------------------------

def _batches(path: Path, fmt: str) -> Iterator[pa.RecordBatch]:
    with pa.OSFile(str(path)) as handle:  # a handle, not the path: no library message can name the spooled file
        yield from _batches_of(handle, fmt)


def _batches_of(handle, fmt: str) -> Iterator[pa.RecordBatch]:
    if fmt == "csv":
        yield from pacsv.open_csv(handle, read_options=pacsv.ReadOptions(block_size=1 << 22),
                                  convert_options=pacsv.ConvertOptions(
                                      column_types={"example_id": pa.string(), "label": pa.float64()},
                                      include_columns=["example_id", "label"]))
    elif fmt == "ndjson":
        # labels are doubles whatever the first block holds (types are fixed from the first block otherwise)
        # lines' nesting and keys bounded as Arrow reads them: one line of 20,000 nested brackets crashed the
        # process, and Arrow builds a column for every key it meets (~3 KB each)
        yield from pajson.open_json(pa.PythonFile(DepthLimited(handle, keys=2 + EXTRA_KEYS), mode="r"),
                                    read_options=pajson.ReadOptions(block_size=1 << 22),
                                    parse_options=pajson.ParseOptions(
                                        explicit_schema=pa.schema([("label", pa.float64())])))
    else:
        yield from _upload_parquet(handle)


# What a Parquet upload may decode to: UPLOAD_DECODED_RATIO times what it weighs, plus UPLOAD_DECODED_FLOOR. Uploads
# are read out of core, but what a body decodes to is parsing, staging on disk and DuckDB's work: a Parquet file of
# labels decodes to a few times its size (ids 2-5x, labels up to 16x), a dictionary-encoded bomb to thousands of
# times (issue 40: 10⁷ rows in 247 KB).
UPLOAD_DECODED_RATIO = 64
UPLOAD_DECODED_FLOOR = 64 << 20


def _upload_parquet(handle) -> Iterator[pa.RecordBatch]:
    """A Parquet upload's example_id and label columns in batches, refused (413 body_too_large) when its metadata
    says they decode to more than the ratio allows, or when the ids its batches name do (counted as
    :func:`~labels_party.store.uploads.parquet_batches` reads them: a row group of one long id named 10⁷ times is read
    as a dictionary, not 10⁷ copies)."""
    metadata = parquet_metadata(handle)  # its footer at most MAX_PARQUET_FOOTER (parsed: ~120 MB at most)
    schema = metadata.schema.to_arrow_schema()
    columns = [name for name in ("example_id", "label") if name in schema.names]
    size = parquet_decoded(metadata, columns, handle)
    # the ratio is to what the columns read weigh: columns never read do not raise it (the review of the twelfth
    # round's fixes padded a body with 7 MB of them)
    limit = UPLOAD_DECODED_FLOOR + UPLOAD_DECODED_RATIO * size.stored
    if size.total > limit:
        raise _decodes_to(size.total, size.stored, " (from the Parquet metadata)")
    decoded, lengths = 0, Memo()
    for batch in parquet_batches(handle, metadata, size, columns, PARSE_ROWS):  # the footer parsed once
        decoded += 16 * batch.num_rows + sum(string_bytes(column, lengths) for column in batch.columns)
        if decoded > limit:
            raise _decodes_to(decoded, size.stored, "")
        yield batch


def _decodes_to(size: int, weight: int, how: str) -> LabelDPError:
    return LabelDPError(f"the labels decode to {size:,} bytes{how}, more than {UPLOAD_DECODED_RATIO} times the "
                        f"{weight:,} bytes their columns weigh in the body (+{UPLOAD_DECODED_FLOOR >> 20} MiB): a "
                        "Parquet body compressed "
                        "this far is refused (send it as CSV, or write it without dictionary encoding)",
                        code=ErrorCode.BODY_TOO_LARGE)


def _parquet(source) -> pq.ParquetFile:
    """Read page by page through a buffer: a row group's column chunk (any size the writer chose) is never held
    whole."""
    return pq.ParquetFile(source, buffer_size=STREAM_BUFFER, pre_buffer=False)


def _row_group_rows(table: pa.Table) -> int:
    """Rows per row group for about :data:`ROW_GROUP_BYTES` of ``table``'s kind of rows."""
    return max(1, min(BATCH_ROWS, table.num_rows * ROW_GROUP_BYTES // max(1, table.nbytes)))


@dataclass
class _ClipCounts:
    below: int = 0
    above: int = 0


# An example id is an identifier: at most this many UTF-8 bytes (the seventeenth review: 60 rows naming one 8 MB id
# passed every decode bound and took +1,001 MB in the staged file's duplicate check)
MAX_EXAMPLE_ID_BYTES = 4096


def _checked(batch: pa.RecordBatch, domain, clip: dict | None, counts: _ClipCounts) -> tuple[pa.Array, np.ndarray]:
    names = batch.schema.names
    if "example_id" not in names or "label" not in names:
        raise LabelDPError("labels need columns example_id and label", code=ErrorCode.MALFORMED_FILE)
    ids = pc.cast(batch.column("example_id"), pa.string())
    ids.validate(full=True)  # UTF-8 (Arrow's JSON reader does not check it): raises ArrowInvalid
    labels = pc.cast(batch.column("label"), pa.float64())
    if ids.null_count or pc.any(pc.equal(pc.utf8_length(ids), 0)).as_py():
        raise LabelDPError("an example_id is missing or empty", code=ErrorCode.MALFORMED_FILE)
    if len(ids) and pc.max(pc.binary_length(ids)).as_py() > MAX_EXAMPLE_ID_BYTES:
        raise LabelDPError(f"an example_id is longer than {MAX_EXAMPLE_ID_BYTES:,} bytes",
                           code=ErrorCode.MALFORMED_FILE)
    if labels.null_count:
        raise LabelDPError("a label is missing", code=ErrorCode.MALFORMED_FILE)
    values = labels.to_numpy(zero_copy_only=False)
    if not np.all(np.isfinite(values)):
        raise LabelDPError("labels must be finite numbers (no NaN or inf)", code=ErrorCode.LABEL_OUT_OF_DOMAIN)
    if clip is not None:
        counts.below += int(np.count_nonzero(values < clip["low"]))
        counts.above += int(np.count_nonzero(values > clip["high"]))
        values = np.clip(values, clip["low"], clip["high"])
    check_labels(domain, values)
    return ids, values


def _parse_to(path: Path, fmt: str, domain, clip: dict | None, target: Path) -> tuple[int, _ClipCounts]:
    """Parse, check and write the upload as Parquet row groups (``registry_index`` = row number for now)."""
    counts, rows = _ClipCounts(), 0
    pending: list[tuple[pa.Array, np.ndarray]] = []  # small batches (a body of many small row groups) written
    pending_rows = pending_bytes = 0  # together: a row group each made the staged file and DuckDB slow

    def flush() -> None:
        nonlocal rows, pending_rows, pending_bytes
        if pending:
            ids = pa.concat_arrays([i for i, _ in pending])
            values = np.concatenate([v for _, v in pending])
            table = pa.table({"registry_index": np.arange(rows, rows + len(values)), "example_id": ids,
                              "label": values}, schema=VERSION_SCHEMA)
            writer.write_table(table, row_group_size=_row_group_rows(table))
            rows += len(values)
            pending.clear()
            pending_rows = pending_bytes = 0

    try:
        with pq.ParquetWriter(target, VERSION_SCHEMA, compression="zstd") as writer:
            for batch in _batches(path, fmt):
                checked = _checked(batch, domain, clip, counts)
                pending.append(checked)
                pending_rows += len(checked[1])
                pending_bytes += checked[0].nbytes
                if pending_rows >= PARSE_ROWS or pending_bytes >= ROW_GROUP_BYTES:
                    flush()
            flush()
    except (pa.ArrowException, OSError) as err:  # any Arrow parse/convert/missing-column failure
        # ... but a full disk or exhausted memory while the staged file is written is the service's (507/503)
        raise resource_error(err) or LabelDPError(f"cannot parse the {fmt} body: {library_message(err)}",
                                                  code=ErrorCode.MALFORMED_FILE) from None
    if rows == 0:
        raise LabelDPError("the upload holds no labels", code=ErrorCode.EMPTY_LABELS)
    pa.default_memory_pool().release_unused()  # Arrow's allocator keeps what parsing freed; DuckDB works next
    return rows, counts


def _registry_sql(store: DataStore, parts: Sequence[RegistryPart]) -> str:
    selects = []
    for part in parts:
        selects.append(f"SELECT example_id, registry_index FROM read_parquet({_quoted(store.path(part.file))}) "
                       f"WHERE registry_index >= {int(part.start)} AND registry_index < {int(part.end)}")
    return " UNION ALL ".join(selects)


def _refuse_duplicates(connection, staged: Path) -> None:
    """409 for an id the upload names twice. Its ids' 64-bit hashes are grouped first (8 bytes a row, whatever the
    ids' length: grouping 65,536 ids of 4 KB themselves ran out of DuckDB's memory), then only the ids whose hash
    repeats."""
    duplicate = connection.execute("""
        WITH repeated AS (SELECT hash(example_id) AS h FROM read_parquet($1) GROUP BY h HAVING count(*) > 1)
        SELECT example_id FROM read_parquet($1) WHERE hash(example_id) IN (SELECT h FROM repeated)
        GROUP BY example_id HAVING count(*) > 1 LIMIT 1""", [str(staged)]).fetchone()
    if duplicate is not None:
        raise LabelDPError(f"duplicate example_id {duplicate[0]!r}", code=ErrorCode.DUPLICATE_EXAMPLE_ID)


def id_bytes_of(connection, staged: Path) -> int:
    """Σ of the ids' UTF-8 bytes (DuckDB's strlen counts bytes): a release's estimate of what it will store reads
    this, never a file holding labels, whose compressed size is a function of them (issue 40's 33rd review: a
    grantee read the owner's base rate, and often one label's change, from a free 507's figures)."""
    row = connection.execute("SELECT coalesce(sum(strlen(example_id)), 0) FROM read_parquet($1)",
                             [str(staged)]).fetchone()
    return int(row[0]) if row is not None else 0


def _copy(connection, query: str, target: Path) -> None:
    connection.execute(f"COPY ({query}) TO {_quoted(target)} (FORMAT parquet, COMPRESSION zstd, "
                       f"ROW_GROUP_SIZE {BATCH_ROWS}, ROW_GROUP_SIZE_BYTES '{ROW_GROUP_BYTES // 1024}KB')")


def _quoted(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def _assign_indices(connection, store: DataStore, staged: Path, parts, registry_size: int, target: Path) -> int:
    """Known ids keep their index; new ones get registry_size, registry_size + 1, … in upload order. Writes the
    version sorted by index; returns the number of new ids.

    Sorting by ``coalesce(known index, registry_size + position)`` puts the known ids in index order and the new
    ones after them (every known index is below registry_size) in upload order: numbering the new ones is then a
    running count over the sorted rows, done while they are written (no window function, no table in DuckDB)."""
    joined, ordered = target.with_name("joined.parquet"), target.with_name("ordered.parquet")
    _copy(connection, f"""
        SELECT coalesce(r.registry_index, {int(registry_size)} + u.registry_index) AS sort_key,
               r.registry_index AS known, u.example_id, u.label
        FROM read_parquet({_quoted(staged)}) u LEFT JOIN ({_registry_sql(store, parts)}) r USING (example_id)""",
          joined)
    _copy(connection, f"SELECT known, example_id, label FROM read_parquet({_quoted(joined)}) ORDER BY sort_key",
          ordered)
    joined.unlink()
    new = 0
    with pq.ParquetWriter(target, VERSION_SCHEMA, compression="zstd") as writer:
        for batch in _parquet(ordered).iter_batches(batch_size=PARSE_ROWS):
            known = batch.column("known")
            fresh = known.is_null().to_numpy(zero_copy_only=False)
            index = pc.fill_null(known, 0).to_numpy(zero_copy_only=False).astype(np.int64)
            index[fresh] = registry_size + new + np.arange(np.count_nonzero(fresh))
            new += int(np.count_nonzero(fresh))
            table = pa.table({"registry_index": index, "example_id": batch.column("example_id"),
                              "label": batch.column("label")}, schema=VERSION_SCHEMA)
            writer.write_table(table, row_group_size=_row_group_rows(table))
    ordered.unlink()
    return new


def ingest(store: DataStore, dataset_id: str, version: int, path: Path, fmt: str, domain, clip: dict | None,
           parts: Sequence[RegistryPart], registry_size: int, memory_mb: int = DUCKDB_MEMORY_MB) -> Ingested:
    """Parse, check and store an upload as label version ``version`` (files only; the caller commits the rows
    that make them count). ``memory_mb``: DuckDB's memory limit (it spills beyond it)."""
    # unique per attempt: a concurrent upload of the same version never overwrites (or later removes) this one's
    relative = f"datasets/{dataset_id}/labels_v{version:06d}_{uuid.uuid4().hex}.parquet"
    scratch = store.path(f"tmp/{uuid.uuid4().hex}")
    scratch.mkdir(parents=True)
    try:
        staged = scratch / "staged.parquet"
        rows, counts = _parse_to(path, fmt, domain, clip, staged)
        connection, spill = duckdb_connection(store, memory_mb)
        try:
            _refuse_duplicates(connection, staged)
            id_bytes = id_bytes_of(connection, staged)
            bulk = None if domain.label_kind == "classes" else _bulk(connection, staged)
            if parts:  # an existing registry: join, number the new ids, sort by index
                final = scratch / "version.parquet"
                new = _assign_indices(connection, store, staged, parts, registry_size, final)
            else:  # the first upload: the row number is the index, already sorted
                final, new = staged, rows
        except duckdb.Error as err:  # its spill directory's disk full, or its memory limit: 507/503
            resource = resource_error(err)
            if resource is None:
                raise
            raise resource from None
        finally:
            connection.close()
            _remove_tree(spill)
        store.adopt(final, relative)
        try:
            # pending until its version commits (keep), discarded by an upload that loses the commit race or is
            # refused: left in place, each such upload kept 8 bytes a row that no quota counted (the 28th review)
            coverage = write_coverage(store, dataset_id, _index_chunks(store, relative), total=rows, pending=True)
        except BaseException:
            store.remove(relative)
            raise
    finally:
        _remove_tree(scratch)
    return Ingested(relative, coverage, rows, new, registry_size, registry_size + new, counts.below, counts.above,
                    bulk, id_bytes)


def _bulk(connection, staged: Path) -> tuple[float, float]:
    """The labels' approximate :data:`BULK_QUANTILES` (DuckDB's t-digest: one streaming pass, bounded memory) — for
    the owner's own warning, never released."""
    low, high = connection.execute(
        f"SELECT approx_quantile(label, {BULK_QUANTILES[0]}), approx_quantile(label, {BULK_QUANTILES[1]}) "
        f"FROM read_parquet({_quoted(staged)})").fetchone()
    return float(low), float(high)


def _remove_tree(path: Path) -> None:
    for child in sorted(path.glob("**/*"), reverse=True):
        child.unlink() if child.is_file() else child.rmdir()
    path.rmdir()


# -- coverage sets ----------------------------------------------------------------------------------------------

def _index_chunks(store: DataStore, relative: str) -> Iterator[np.ndarray]:
    for batch in _parquet(store.path(relative)).iter_batches(batch_size=BATCH_ROWS, columns=["registry_index"]):
        yield batch.column(0).to_numpy()


def write_coverage(store: DataStore, dataset_id: str, chunks, total: int | None = None, *,
                   pending: bool = False) -> CoverageSet:
    """Store sorted registry indices (given as chunks, in order) once, under their SHA-256 (``pending``: only in
    scratch, unless they are stored already; see :class:`CoverageSet`)."""
    scratch_name = f"tmp/{uuid.uuid4().hex}.npy"
    scratch = store.path(scratch_name)
    scratch.parent.mkdir(parents=True, exist_ok=True)
    chunks = list(chunks) if total is None else chunks
    total = sum(len(c) for c in chunks) if total is None else total
    digest = hashlib.sha256()

    def checked():
        previous = -1
        for chunk in chunks:
            chunk = np.ascontiguousarray(chunk, dtype=np.int64)
            if chunk.size and (chunk[0] <= previous or np.any(np.diff(chunk) <= 0)):
                raise ValueError("coverage must be strictly increasing")
            digest.update(chunk.tobytes())
            previous = int(chunk[-1]) if chunk.size else previous
            yield chunk

    try:
        write_npy(scratch, np.int64, total, checked())
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise
    sha = digest.hexdigest()
    relative = f"datasets/{dataset_id}/coverage/{sha}.npy"
    if store.path(relative).exists():
        scratch.unlink()
    elif pending:
        return CoverageSet(relative, sha, total, pending=scratch_name)
    else:
        store.adopt(scratch, relative)
    return CoverageSet(relative, sha, total)


def coverage_of(store: DataStore, dataset_id: str, indices: np.ndarray) -> CoverageSet:
    """The pending coverage set of some registry indices (any order): a request's, kept only if it is charged."""
    return write_coverage(store, dataset_id, [np.unique(np.asarray(indices, dtype=np.int64))], pending=True)


def keep(store: DataStore, coverage: CoverageSet) -> None:
    """Store a pending coverage set under its address (in the charge's transaction, once it is admitted); a crash
    before the commit leaves at worst an unreferenced file, as every write here."""
    if coverage.pending is None:
        return
    if store.path(coverage.file).exists():
        store.remove(coverage.pending)
    else:
        store.adopt(store.path(coverage.pending), coverage.file)


def discard(store: DataStore, coverage: CoverageSet) -> None:
    """Remove a pending coverage set's scratch file (nothing once it was kept)."""
    if coverage.pending is not None:
        store.remove(coverage.pending)


RANGE_PREFIX = "range:"


@dataclass(frozen=True)
class RangeCoverage:
    """The registry indices start..stop-1 without a file (a source dataset's releases cover all its rows); reads
    like a :class:`MappedArray` of them."""

    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start

    def slice(self, i: int, j: int) -> np.ndarray:
        return np.arange(self.start + i, self.start + min(j, self.size), dtype=np.int64)

    def position(self, values) -> np.ndarray:
        return np.clip(np.asarray(values, dtype=np.int64) - self.start, 0, self.size)

    def forget(self) -> None:
        pass


def range_coverage(start: int, stop: int) -> CoverageSet:
    """Its SHA-256 is that of the same indices in a file, so records and audits read it the same way."""
    digest, reader = hashlib.sha256(), RangeCoverage(start, stop)
    for i in range(0, reader.size, BATCH_ROWS * 8):
        digest.update(reader.slice(i, i + BATCH_ROWS * 8).tobytes())
    return CoverageSet(f"{RANGE_PREFIX}{start}:{stop}", digest.hexdigest(), stop - start)


def read_coverage(store: DataStore, coverage_file: str, sha256: str, entries: int | None, *,
                  at_most: int = 0, private: bool = False) -> MappedArray | RangeCoverage:
    """The coverage set a chain records (its file, its indices' SHA-256 and count), memory-mapped — a release of
    10⁸ examples does not load it — once its file is checked to be that set (:meth:`DataStore.checked_array`:
    :class:`~labels_party.store.storage.OutsideDataDirectory` else, unread). ``entries`` None: a record from before
    records counted them, whose file may announce at most ``at_most`` (the registry's size). ``private``: read from
    a copy no writer can change (what a charge reads)."""
    if entries is None:
        entries = store.npy_entries(coverage_file, at_most)
    if coverage_file.startswith(RANGE_PREFIX):
        start, stop = coverage_file.removeprefix(RANGE_PREFIX).split(":")
        covered = RangeCoverage(int(start), int(stop))
        if covered.size != entries:
            raise OutsideDataDirectory(f"{coverage_file!r} is not the range its chain records")
        return covered
    return store.checked_array(coverage_file, np.int64, entries, sha256, private=private)


# -- reading a version ------------------------------------------------------------------------------------------

def iter_version(store: DataStore, file: str,
                 columns: Sequence[str] = ("registry_index", "example_id", "label")) -> Iterator[pa.RecordBatch]:
    """The version's rows in index order, one row group at a time, from one descriptor
    (:meth:`DataStore.open_regular`)."""
    with store.open_regular(file) as handle:
        for batch in _parquet(handle).iter_batches(batch_size=BATCH_ROWS, columns=list(columns)):
            yield pa.RecordBatch.from_pydict({name: batch.column(name) for name in columns})  # in the order asked


def iter_charged(store: DataStore, file: str, coverage: CoverageSet,
                 columns: Sequence[str] = ("example_id", "label")) -> Iterator[pa.RecordBatch]:
    """:func:`iter_version`, whose rows must be the examples ``coverage`` (what the release was charged) holds:
    their registry indices, in order, hash to its SHA-256 — checked as they are read, and the pass refused at its
    end (:class:`~labels_party.store.storage.OutsideDataDirectory`) otherwise. The forty-first review renamed
    another version's label file over the charged one's after the charge, and its 2,000 examples, whose budget
    was spent, were drawn again."""
    digest, rows = hashlib.sha256(), 0
    for batch in iter_version(store, file, ("registry_index", *columns)):
        digest.update(np.ascontiguousarray(batch.column(0).to_numpy(), dtype=np.int64).tobytes())
        rows += batch.num_rows
        yield pa.RecordBatch.from_pydict({name: batch.column(name) for name in columns})
    if (rows, digest.hexdigest()) != (coverage.size, coverage.sha256):
        raise OutsideDataDirectory(f"{file!r} does not hold the examples its release was charged for")


def lookup(store: DataStore, file: str, example_ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(registry index, label) of each requested id, in the request's order; unknown ids are refused. One pass
    over the version; memory in the size of the request."""
    if len(set(example_ids)) != len(example_ids):
        raise LabelDPError("example_ids contains duplicates", code=ErrorCode.DUPLICATE_EXAMPLE_ID)
    wanted = pa.array(example_ids, type=pa.string())
    found_ids, found_index, found_labels = [], [], []
    for batch in iter_version(store, file):
        hit = pc.is_in(batch.column("example_id"), value_set=wanted)
        if pc.any(hit).as_py():
            chosen = batch.filter(hit)
            found_ids.append(chosen.column("example_id"))
            found_index.append(chosen.column("registry_index").to_numpy())
            found_labels.append(chosen.column("label").to_numpy())
    ids = pa.chunked_array(found_ids, type=pa.string())
    position = pc.index_in(wanted, value_set=ids.combine_chunks() if found_ids else pa.array([], pa.string()))
    missing = position.is_null()
    if pc.any(missing).as_py():
        # Counted, never named: the answer must not echo which of a consumer's ids the dataset lacks.
        raise LabelDPError(f"{int(pc.sum(missing.cast(pa.int64())).as_py())} of the {len(example_ids)} example ids "
                           "have no current label in this dataset", code=ErrorCode.UNKNOWN_EXAMPLE_IDS)
    take = position.to_numpy(zero_copy_only=False).astype(np.int64)
    index = np.concatenate(found_index) if found_index else np.zeros(0, np.int64)
    labels = np.concatenate(found_labels) if found_labels else np.zeros(0)
    return index[take], labels[take]
