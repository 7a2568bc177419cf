"""Parsing label uploads (CSV, NDJSON, Parquet) from a spooled file into Arrow/NumPy, batch by batch.

The HTTP layer streams the request body to a temporary file (bounded memory, size-limited); this module reads it
back in record batches with pyarrow, so no Python object is created per label.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from shared.domains import check_labels
from shared.errors import LabelDPError

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
                           "or application/vnd.apache.parquet", code="unsupported_media_type")
    return FORMATS[media]


def _batches(path: Path, fmt: str):
    if fmt == "csv":
        reader = pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=1 << 24),
                                convert_options=pacsv.ConvertOptions(
                                    column_types={"example_id": pa.string(), "label": pa.float64()},
                                    include_columns=["example_id", "label"]))
        yield from reader
    elif fmt == "ndjson":
        table = pajson.read_json(path, read_options=pajson.ReadOptions(block_size=1 << 24))
        yield from table.to_batches()
    else:
        yield from pq.ParquetFile(path).iter_batches(batch_size=1 << 20)


@dataclass(frozen=True)
class ParsedLabels:
    ids: pa.ChunkedArray  # strings, distinct
    labels: np.ndarray  # float64, every one in the domain (after the declared clip)
    clipped_below: int = 0
    clipped_above: int = 0


def parse_labels(path: Path, fmt: str, domain, clip: dict | None = None) -> ParsedLabels:
    """Example ids and labels, every label checked against the domain — after the dataset's declared ``clip``
    ({"low", "high"}), which moves out-of-range labels to the nearer bound and counts them."""
    id_chunks, label_chunks = [], []
    below = above = 0
    try:
        for batch in _batches(path, fmt):
            names = batch.schema.names
            if "example_id" not in names or "label" not in names:
                raise LabelDPError("labels need columns example_id and label", code="malformed_file")
            ids = pc.cast(batch.column("example_id"), pa.string())
            labels = pc.cast(batch.column("label"), pa.float64())
            if ids.null_count or pc.any(pc.equal(pc.utf8_length(ids), 0)).as_py():
                raise LabelDPError("an example_id is missing or empty", code="malformed_file")
            if labels.null_count:
                raise LabelDPError("a label is missing", code="malformed_file")
            values = labels.to_numpy(zero_copy_only=False)
            if not np.all(np.isfinite(values)):
                raise LabelDPError("labels must be finite numbers (no NaN or inf)", code="label_out_of_domain")
            if clip is not None:
                below += int(np.count_nonzero(values < clip["low"]))
                above += int(np.count_nonzero(values > clip["high"]))
                values = np.clip(values, clip["low"], clip["high"])
            check_labels(domain, values)
            id_chunks.append(ids)
            label_chunks.append(values)
    except (pa.ArrowException, OSError) as err:  # any Arrow parse/convert/missing-column failure
        message = str(err).splitlines()[0][:300]
        raise LabelDPError(f"cannot parse the {fmt} body: {message}", code="malformed_file") from None
    if not id_chunks or sum(len(c) for c in id_chunks) == 0:
        raise LabelDPError("the upload holds no labels", code="empty_labels")
    ids = pa.chunked_array(id_chunks, type=pa.string())
    if pc.count_distinct(ids).as_py() != len(ids):
        counts = pc.value_counts(ids)
        duplicate = counts.filter(pc.greater(counts.field("counts"), 1))[0]["values"].as_py()
        raise LabelDPError(f"duplicate example_id {duplicate!r}", code="duplicate_example_id")
    return ParsedLabels(ids, np.concatenate(label_chunks), below, above)


def parse_priors(path: Path, fmt: str, num_classes: int) -> tuple[list[str], np.ndarray]:
    """Per-example priors: columns example_id and p_0..p_{K-1} (non-negative, finite, not all zero per row)."""
    names = [f"p_{k}" for k in range(num_classes)]
    try:
        table = pa.concat_tables(pa.Table.from_batches([b]) for b in _batches_any(path, fmt)) \
            if fmt != "parquet" else pq.read_table(path)
    except (pa.ArrowException, OSError, ValueError) as err:
        raise LabelDPError(f"cannot parse the priors: {str(err).splitlines()[0][:300]}", code="malformed_file") \
            from None
    missing = [c for c in ["example_id", *names] if c not in table.schema.names]
    if missing:
        raise LabelDPError(f"priors need columns example_id, p_0..p_{num_classes - 1}; missing {missing[:3]}",
                           code="malformed_file")
    if table.num_rows == 0:
        raise LabelDPError("no priors in the body", code="empty_labels")
    ids = pc.cast(table.column("example_id"), pa.string()).to_pylist()
    priors = np.column_stack([pc.cast(table.column(c), pa.float64()).to_numpy(zero_copy_only=False)
                              for c in names])
    if not np.all(np.isfinite(priors)) or np.any(priors < 0) or np.any(priors.sum(axis=1) <= 0):
        raise LabelDPError("priors must be finite, non-negative and not all zero in a row", code="invalid_prior")
    return ids, priors


def _batches_any(path: Path, fmt: str):
    if fmt == "csv":
        yield from pacsv.open_csv(path, convert_options=pacsv.ConvertOptions(
            column_types={"example_id": pa.string()}))
    else:
        yield from pajson.read_json(path).to_batches()


def parse_groups(path: Path, fmt: str) -> tuple[list[str], np.ndarray]:
    """Group assignments: columns example_id and group (any strings or integers)."""
    try:
        table = pq.read_table(path) if fmt == "parquet" else pa.concat_tables(
            pa.Table.from_batches([b]) for b in _batches_any(path, fmt))
    except (pa.ArrowException, OSError, ValueError) as err:
        raise LabelDPError(f"cannot parse the groups: {str(err).splitlines()[0][:300]}", code="malformed_file") \
            from None
    if not {"example_id", "group"} <= set(table.schema.names):
        raise LabelDPError("groups need columns example_id and group", code="malformed_file")
    if table.num_rows == 0:
        raise LabelDPError("no group assignments in the body", code="empty_labels")
    groups = pc.cast(table.column("group"), pa.string())
    if groups.null_count:
        raise LabelDPError("a group is missing", code="malformed_file")
    return pc.cast(table.column("example_id"), pa.string()).to_pylist(), np.array(groups.to_pylist())
