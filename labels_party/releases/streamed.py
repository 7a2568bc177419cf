"""A release of a whole label version in bounded memory: two passes over its Parquet row groups.

1. **histogram** — each row group's labels are mapped to their row of the finite support and counted (exact
   integers); the mechanism is planned from the counts (noisy prior, solve, certificate) exactly as for a small
   release (:func:`labels_party.core.pipeline.plan`);
2. **sample** — each row group is privatized with the plan's sampler and written as a row group of the release
   file (``example_id`` and the released value).

Continuous labels on a grid are rounded at random; both passes must see the *same* rounding, so it is drawn from
a stream keyed by a secret taken from the release's randomness and replayed in the second pass — nothing is
spilled to disk and the rounding stays as unpredictable as the release's own source.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from randomgen import AESCounter

from labels_party.core.pipeline import Plan, Prepared, plan, support_rows

ROUNDING_KEY_BYTES = 16  # an AES-128 key for the rounding stream


@dataclass(frozen=True)
class StreamedRelease:
    plan: Plan
    write: Callable[[Path], None]  # pass 2: writes the release file (example_id + released values)


def plan_version(prepared: Prepared, read: Callable[[], Iterator[pa.RecordBatch]],
                 rng: np.random.Generator) -> StreamedRelease:
    """``read()`` yields the version's row groups (columns example_id, label), the same ones on every call."""
    domain, mechanism = prepared.domain, prepared.mechanism
    finite = domain.support()
    rounding_key = int.from_bytes(rng.bytes(ROUNDING_KEY_BYTES), "little")

    def rows_of_batches() -> Iterator[tuple[pa.RecordBatch, np.ndarray | None]]:
        rounding = np.random.Generator(AESCounter(key=rounding_key))  # the same draws on every pass
        for batch in read():
            labels = batch.column("label").to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
            yield batch, support_rows(domain, labels, mechanism, rounding)

    counts = np.zeros(finite.size, dtype=np.int64)
    for _batch, rows in rows_of_batches():
        if rows is None:
            break  # a mechanism on raw continuous labels needs no histogram
        counts += np.bincount(rows, minlength=finite.size)
    planned = plan(prepared, counts, rng)

    def write(path: Path) -> None:
        writer = None
        try:
            for batch, rows in rows_of_batches():
                if rows is not None:
                    values = finite.values[rows]
                else:  # raw labels, checked against the domain by rows_of_batches
                    values = np.asarray(batch.column("label").to_numpy(zero_copy_only=False), dtype=np.float64)
                table = _release_table(batch.column("example_id"), planned.sampler.sample(values, rng))
                writer = writer or pq.ParquetWriter(path, table.schema, compression="zstd")
                writer.write_table(table)
        finally:
            if writer is not None:
                writer.close()

    return StreamedRelease(planned, write)


def write_example_ids(read: Callable[[], Iterator[pa.RecordBatch]]) -> Callable[[Path], None]:
    """The file of a labelless release of a whole version: its examples' ids, one row group per batch read."""

    def write(path: Path) -> None:
        writer = None
        try:
            for batch in read():
                table = pa.table({"example_id": batch.column("example_id")})
                writer = writer or pq.ParquetWriter(path, table.schema, compression="zstd")
                writer.write_table(table)
        finally:
            if writer is not None:
                writer.close()

    return write


def _release_table(example_ids: pa.Array, noisy: np.ndarray) -> pa.Table:
    if noisy.ndim == 2:  # label sets (one boolean column per class) or ALIBI's vectors (one integer column)
        return pa.table({"example_id": example_ids, **{f"in_class_{k}": noisy[:, k] for k in range(noisy.shape[1])}})
    return pa.table({"example_id": example_ids, "label": np.asarray(noisy, dtype=np.float64)})
