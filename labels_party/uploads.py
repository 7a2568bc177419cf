"""Upload formats, and the per-example bodies of releases (priors, groups) read from a spooled file with pyarrow.

Labels themselves are parsed by :mod:`labels_party.labelstore`, batch by batch into Parquet row groups.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from shared.errors import LabelDPError, library_message, resource_error

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


def parse_priors(path: Path, fmt: str, num_classes: int) -> tuple[list[str], np.ndarray]:
    """Per-example priors: columns example_id and p_0..p_{K-1} (non-negative, finite, not all zero per row)."""
    names = [f"p_{k}" for k in range(num_classes)]
    with _parsing("the priors"):
        table = _read_table(path, fmt)
        missing = [c for c in ["example_id", *names] if c not in table.schema.names]
        if missing:
            raise LabelDPError(f"priors need columns example_id, p_0..p_{num_classes - 1}; missing {missing[:3]}",
                               code="malformed_file")
        if table.num_rows == 0:
            raise LabelDPError("no priors in the body", code="empty_labels")
        ids = _strings(table.column("example_id")).to_pylist()
        priors = np.column_stack([pc.cast(table.column(c), pa.float64()).to_numpy(zero_copy_only=False)
                                  for c in names])
    if not np.all(np.isfinite(priors)) or np.any(priors < 0) or np.any(priors.sum(axis=1) <= 0):
        raise LabelDPError("priors must be finite, non-negative and not all zero in a row", code="invalid_prior")
    return ids, priors


MAX_GROUP_NAME = 200  # characters


def parse_groups(path: Path, fmt: str) -> tuple[list[str], np.ndarray]:
    """Group assignments: columns example_id and group (any strings or integers)."""
    with _parsing("the groups"):
        table = _read_table(path, fmt, dictionary=("group",))
        if not {"example_id", "group"} <= set(table.schema.names):
            raise LabelDPError("groups need columns example_id and group", code="malformed_file")
        if table.num_rows == 0:
            raise LabelDPError("no group assignments in the body", code="empty_labels")
        if table.column("group").null_count:
            raise LabelDPError("a group is missing", code="malformed_file")
        return _strings(table.column("example_id")).to_pylist(), _group_of_rows(table.column("group"))


def _group_of_rows(column: pa.ChunkedArray) -> np.ndarray:
    """Each row's group name, as references to one string per group: a column of names is never expanded (a
    fixed-width array of them took rows x the longest name x 4 bytes — 8.7 GB from a 2 MB Parquet body whose
    dictionary held a thousand 900-character names)."""
    index: dict[str, int] = {}
    rows = []
    for chunk in column.chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = pc.cast(chunk, pa.string()).dictionary_encode()  # as large as the body that carried it
        names = _strings(pa.chunked_array([chunk.dictionary])).to_pylist()
        if max(map(len, names), default=0) > MAX_GROUP_NAME:
            raise LabelDPError(f"group names are at most {MAX_GROUP_NAME} characters", code="malformed_file")
        codes = np.asarray([index.setdefault(name, len(index)) for name in names], dtype=np.int64)
        rows.append(codes[np.asarray(chunk.indices.to_numpy(zero_copy_only=False), dtype=np.int64)])
    return np.array(list(index), dtype=object)[np.concatenate(rows)]


@contextlib.contextmanager
def _parsing(what: str):
    """A body Arrow cannot read or convert is a 400 that says what is wrong with it (never a 500); the service
    running out of disk, memory or descriptors meanwhile is not the body's fault (507/503)."""
    try:
        yield
    except LabelDPError:
        raise
    except (pa.ArrowException, OSError, ValueError) as err:  # UnicodeDecodeError is a ValueError
        raise resource_error(err) or LabelDPError(f"cannot parse {what}: {library_message(err)}",
                                                  code="malformed_file") from None


# Parquet compresses: a small body can hold gigabytes of values (2 MB held 1.8 GB of group names). Its metadata
# states what it expands to; beyond this, it is refused before it is read (CSV and NDJSON are what they weigh).
MAX_PARQUET_EXPANDED_BYTES = 1 << 30


def _read_table(path: Path, fmt: str, dictionary: tuple[str, ...] = ()) -> pa.Table:
    """``dictionary``: columns a Parquet body keeps dictionary-encoded (never expanded to one value per row)."""
    with pa.OSFile(str(path)) as handle:  # a handle, not the path: no library message can name the spooled file
        if fmt == "parquet":
            metadata = pq.ParquetFile(handle).metadata
            expanded = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
            if expanded > MAX_PARQUET_EXPANDED_BYTES:
                raise LabelDPError(f"the body expands to {expanded:,} bytes, over {MAX_PARQUET_EXPANDED_BYTES:,}",
                                   code="body_too_large")
            handle.seek(0)
            return pq.read_table(handle, read_dictionary=[c for c in dictionary if c in metadata.schema.names])
        if fmt == "csv":
            return pacsv.read_csv(handle, convert_options=pacsv.ConvertOptions(
                column_types={"example_id": pa.string()}))
        return pajson.read_json(handle)


def _strings(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """As strings, checked to be valid UTF-8 (Arrow's JSON reader does not check)."""
    strings = pc.cast(column, pa.string())
    strings.validate(full=True)
    return strings
