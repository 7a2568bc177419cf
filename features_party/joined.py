"""A job's training rows, out of core (issue 43): its features — one Parquet file or a directory of them, larger
than memory — joined by example id with its release's privatized labels (a Parquet file downloaded to disk) by
DuckDB, which spills to the job's directory past its memory limit. The rows the job's split holds out are left out;
each remaining row is kept for validation by a seeded hash of its id (the same rows whatever the table's order or
the number of files), and both parts are written as they join, as the row groups the learners stream
(:mod:`features_party.learn.streamed`), which shuffle as they read: the MLP visits the row groups in a fresh random
order each epoch and shuffles the rows of each (a sort of the whole join ran out of DuckDB's memory at 10⁷ rows).
The preprocessing — numeric columns' means and deviations, categorical vocabularies — and the squared loss's target
scaling are fitted by DuckDB on the training rows alone, as
:meth:`features_party.features.Preprocessor.fit` fits them in memory; predictions for every row of the features are
streamed to a Parquet file a batch at a time (:func:`predict_table`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq

from features_party.features import ID, Preprocessor
from features_party.learn.output import predictions_table
from features_party.learn.streamed import Rows, Scaling
from shared.errors import ErrorCode, LabelDPError

ROW_GROUP_ROWS = 1 << 16  # rows of a row group the learners read at once (DuckDB buffers one a writing thread: 1 << 18
# rows of 20 features took 87 MiB each, and two threads ran out of its 488 MiB at 10⁷ rows)
HASH_RANGE = 1_000_000  # a row is kept for validation when its id's seeded hash mod this is below fraction × it


@dataclass(frozen=True)
class Joined:
    """The training rows on disk, split, with the preprocessing and target scaling fitted on the training part."""

    fit: Rows
    validation: Rows
    scaling: Scaling
    matched: int  # released example ids with features (held-out ones included)
    estimate: Rows | None = None  # the job's estimate rows, if it keeps some


@contextlib.contextmanager
def connection(workdir: Path, memory_bytes: int, threads: int) -> Iterator[duckdb.DuckDBPyConnection]:
    """An in-memory DuckDB that spills to ``workdir/spill`` past ``memory_bytes`` and reads no file it is not
    named (no extension is installed or loaded on demand)."""
    spill = workdir / "spill"
    spill.mkdir(parents=True, exist_ok=True)
    # insertion order is not kept (every COPY that needs an order says ORDER BY): keeping it held whole row groups
    # of a 10⁷-row join in memory, past the limit (out of memory at 488 MiB, the scale bench)
    con = duckdb.connect(config={"memory_limit": f"{max(memory_bytes >> 20, 64)}MB", "threads": max(threads, 1),
                                 "temp_directory": str(spill), "autoinstall_known_extensions": False,
                                 "autoload_known_extensions": False, "preserve_insertion_order": False})
    try:
        yield con
    finally:
        con.close()


def parquet_files(features: Path) -> list[str]:
    """The Parquet files of a features table: the file itself, or every ``*.parquet`` under the directory."""
    files = [str(features)] if features.is_file() else sorted(str(p) for p in features.rglob("*.parquet"))
    if not files:
        raise LabelDPError("the features table has no Parquet file", code=ErrorCode.MALFORMED_FILE)
    return files


def join(features: Path, labels: Path, workdir: Path, *, numeric: Sequence[str], categorical: Sequence[str],
         seed: int, validation_fraction: float, held_out: Path | None = None, standardize_targets: bool = True,
         estimate_fraction: float = 0.0, max_levels: int = 1 << 16, memory_bytes: int = 1 << 30) -> Joined:
    """Join, split and write (``workdir/fit.parquet``, ``workdir/validation.parquet`` and, with an
    ``estimate_fraction``, ``workdir/estimate.parquet``: the job's estimate rows by the rule of
    :func:`features_party.parts.estimate_mask`, never trained or validated on), then fit the preprocessing on the
    training part. ``held_out``: a Parquet file of example ids the job's split holds out."""
    columns = list(dict.fromkeys((*numeric, *categorical)))
    if ID in columns:
        raise LabelDPError("example_id is the key, not a feature", code=ErrorCode.MALFORMED_FILE)
    # one thread: two ran out of a 488 MiB limit at 10⁷ rows (each writing thread buffers its row groups), one
    # joined them in 46 s within it
    with connection(workdir, memory_bytes, 1) as con:
        # (a view takes no parameters: the paths are this service's own, quoted as literals; the rest are numbers)
        con.execute(f"CREATE VIEW features AS SELECT * FROM read_parquet({files_literal(parquet_files(features))})")
        check_columns(con, numeric, categorical)
        con.execute("CREATE VIEW labels AS SELECT CAST(example_id AS VARCHAR) AS example_id, label "
                    f"FROM read_parquet('{literal(labels)}')")
        held = (f"AND CAST(f.example_id AS VARCHAR) NOT IN (SELECT CAST(example_id AS VARCHAR) FROM "
                f"read_parquet('{literal(held_out)}'))" if held_out is not None else "")
        selected = ", ".join(f'f."{c}"' for c in columns)
        seed, kept = int(seed), round(validation_fraction * HASH_RANGE)
        estimating = f"{uniform_sql('l.example_id', f'estimate:{seed}:')} < {float(estimate_fraction)!r}"
        con.execute(f"""CREATE VIEW joined AS SELECT l.example_id, {selected}, l.label AS label,
                        CASE WHEN {estimating} THEN 'estimate'
                             WHEN hash(CAST(f.example_id AS VARCHAR) || ':validation:{seed}') % {HASH_RANGE} < {kept}
                             THEN 'validation' ELSE 'fit' END AS part
                        FROM features f JOIN labels l ON CAST(f.example_id AS VARCHAR) = l.example_id
                        WHERE true {held}""")
        matched = _one(con, "SELECT count(*) FROM features f JOIN labels l "
                            "ON CAST(f.example_id AS VARCHAR) = l.example_id")[0]
        paths = {}
        for part in ("fit", "validation", "estimate")[:3 if estimate_fraction > 0 else 2]:
            paths[part] = workdir / f"{part}.parquet"
            quoted = ", ".join(f'"{c}"' for c in columns)
            # no ORDER BY: a sort of the whole join's rows ran out of DuckDB's memory at 10⁷ rows (the scale bench;
            # written as they join it took 46 s and stayed within it); the learners shuffle as they read
            con.execute(f"COPY (SELECT example_id, {quoted}, label FROM joined WHERE part = '{part}') "
                        f"TO '{literal(paths[part])}' (FORMAT parquet, ROW_GROUP_SIZE {ROW_GROUP_ROWS})")
        preprocessor, scaling = _fitted(con, paths["fit"], numeric, categorical, max_levels, standardize_targets)
    estimate = Rows(paths["estimate"], preprocessor) if "estimate" in paths else None
    return Joined(Rows(paths["fit"], preprocessor), Rows(paths["validation"], preprocessor), scaling, int(matched),
                  estimate)


def uniform_sql(expression: str, prefix: str) -> str:
    """SQL for :func:`shared.splits` numbers of an id (``expression``, a string): the top 53 bits of
    SHA-256(prefix + id) / 2^53 — ``"{seed}:"`` a holdout split's, ``"estimate:{seed}:"`` a job's estimate rows'."""
    quoted = prefix.replace("'", "''")
    return (f"(('0x' || substr(sha256('{quoted}' || {expression}), 1, 16))::UBIGINT >> 11)::DOUBLE "
            "/ 9007199254740992.0")


def files_literal(files: Sequence[str]) -> str:
    """A list of paths as a SQL list of string literals (for read_parquet in a view, which takes no parameter)."""
    return "[" + ", ".join(f"'{literal(Path(f))}'" for f in files) + "]"


def literal(path: Path) -> str:
    """A path as a SQL string literal's body (COPY takes no parameter for its target, a view none at all)."""
    return str(path).replace("'", "''")


def check_columns(con: duckdb.DuckDBPyConnection, numeric: Sequence[str], categorical: Sequence[str]) -> None:
    """The job's columns are in the view ``features``, the numeric ones numbers (from its schema: no row read)."""
    types = dict(con.execute("SELECT column_name, column_type FROM (DESCRIBE features)").fetchall())
    missing = [c for c in (*numeric, *categorical, ID) if c not in types]
    if missing:
        raise LabelDPError(f"feature columns missing: {missing}", code=ErrorCode.MALFORMED_FILE)
    numbers = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
               "UBIGINT", "FLOAT", "DOUBLE", "BOOLEAN")
    bad = [c for c in numeric if not (types[c] in numbers or types[c].startswith("DECIMAL"))]
    if bad:
        raise LabelDPError(f"numeric feature columns hold something other than numbers: {bad}",
                           code=ErrorCode.MALFORMED_FILE)


def _fitted(con: duckdb.DuckDBPyConnection, fit: Path, numeric: Sequence[str], categorical: Sequence[str],
            max_levels: int, standardize_targets: bool) -> tuple[Preprocessor, Scaling]:
    """The preprocessing and target scaling of the training rows (population deviations, as numpy's; a constant
    column's deviation 1)."""
    aggregates = [f'avg(CAST("{c}" AS DOUBLE)), stddev_pop(CAST("{c}" AS DOUBLE))' for c in numeric]
    row = _one(con, f"SELECT count(*), avg(label), stddev_pop(label) {''.join(', ' + a for a in aggregates)} "
                    f"FROM read_parquet('{literal(fit)}')")
    means = tuple(float(row[3 + 2 * i] or 0.0) for i in range(len(numeric)))
    stds = tuple(_deviation(row[4 + 2 * i]) for i in range(len(numeric)))
    vocabularies = []
    for column in categorical:
        levels = [v for (v,) in con.execute(
            f'SELECT DISTINCT CAST("{column}" AS VARCHAR) AS v FROM read_parquet(?) WHERE v IS NOT NULL ORDER BY v '
            f"LIMIT {max_levels + 1}", [str(fit)]).fetchall()]
        if len(levels) > max_levels:
            raise LabelDPError(f"categorical column {column!r} has more than {max_levels:,} levels in the training "
                               "rows", code=ErrorCode.JOB_TOO_LARGE)
        vocabularies.append(tuple(levels))
    scaling = Scaling(float(row[1] or 0.0), _deviation(row[2])) if standardize_targets else Scaling()
    return Preprocessor(tuple(numeric), tuple(categorical), means, stds, tuple(vocabularies)), scaling


def _one(con: duckdb.DuckDBPyConnection, query: str) -> tuple:
    row = con.execute(query).fetchone()
    assert row is not None  # (an aggregate's one row)
    return row


def _deviation(value: float | None) -> float:
    return float(value) if value is not None and math.isfinite(value) and value > 0 else 1.0


PREDICT_ROWS = 1 << 16


def predict_table(features: Path, preprocessor: Preprocessor, predict: Callable[[np.ndarray, np.ndarray], np.ndarray],
                  out: Path, *, held_out: Path | None = None, workdir: Path, memory_bytes: int = 1 << 28,
                  threads: int = 1) -> int:
    """Predictions for every row of the features (``predict(numeric, categorical)``: the job's output applied),
    :data:`PREDICT_ROWS` at a time, to ``out`` (Parquet: ``example_id``, ``prediction`` — the class, with
    ``p_class_k`` probabilities, for a class model — and ``holdout``, the rows the split held out). Returns the rows
    written."""
    columns = list(dict.fromkeys((*preprocessor.numeric, *preprocessor.categorical)))
    quoted = ", ".join(f'f."{c}"' for c in columns)
    held = (f", CAST(f.example_id AS VARCHAR) IN (SELECT CAST(example_id AS VARCHAR) FROM "
            f"read_parquet('{literal(held_out)}')) AS holdout" if held_out is not None else ", false AS holdout")
    written = 0
    with connection(workdir, memory_bytes, threads) as con, contextlib.ExitStack() as stack:
        reader = con.sql(f"SELECT CAST(f.example_id AS VARCHAR) AS example_id, {quoted}{held} "
                         f"FROM read_parquet({files_literal(parquet_files(features))}) f").to_arrow_reader(PREDICT_ROWS)
        writer: pq.ParquetWriter | None = None
        for batch in reader:
            frame = batch.to_pandas()
            numeric, categorical = preprocessor.transform(frame)
            predicted = predict(numeric, categorical)
            table = predictions_table(frame[ID].to_numpy(), predicted, frame["holdout"].to_numpy(bool))
            if writer is None:
                writer = stack.enter_context(pq.ParquetWriter(out, table.schema))
            writer.write_table(table)
            written += table.num_rows
    if writer is None:  # (a table the job trained on has rows)
        raise LabelDPError("the features table has no rows", code=ErrorCode.MALFORMED_FILE)
    return written
