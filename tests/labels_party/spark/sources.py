"""Parquet label sources for the Spark tests: a directory of files, as a Spark job would read them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def write_source(directory: Path, ids, labels, *, files: int = 4) -> str:
    """``files`` Parquet files of consecutive rows (columns example_id, label as given); the directory's path."""
    directory.mkdir(parents=True, exist_ok=True)
    ids, labels = pa.array(ids), pa.array(labels)
    bounds = np.linspace(0, len(ids), files + 1).astype(int)
    for index, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        table = pa.table({"example_id": ids[start:stop], "label": labels[start:stop]})
        pq.write_table(table, directory / f"part-{index:02d}.parquet")
    return str(directory)


def read_parts(output: str) -> list[pa.Table]:
    """The released tables of a Spark output directory, one per part file, in partition order."""
    return [pq.read_table(path) for path in sorted(Path(output).glob("part-*.parquet"))]


def read_all(output: str) -> pa.Table:
    return pa.concat_tables(read_parts(output))


def register(ctx, client, headers: dict, body: dict) -> dict:
    """``POST /v1/datasets`` of a source (202, ``registering``, its Location), its job run here, then the dataset as
    its owner's admin reads it (``ready``, or ``failed`` with its error)."""
    response = client.post("/v1/datasets", headers=headers, json=body)
    assert response.status_code == 202, response.text
    created = response.json()
    assert created["state"] == "registering" and response.headers["location"] == f"/v1/datasets/{created['id']}"
    ctx.jobs.run_pending()
    read = client.get(response.headers["location"], headers=headers)
    assert read.status_code == 200, read.text
    return read.json()
