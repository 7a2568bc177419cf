"""What a crash leaves under the data directory goes when the labels party starts again (issue 26): temporaries
of interrupted writes, scratch and DuckDB spill directories, release files no release row references, source copies
no dataset names and the attempts of jobs whose workers died. Referenced release files, label versions, coverage and
budget files stay."""

from __future__ import annotations

import uuid
from pathlib import Path

from labels_party.runtime.context import make_context
from tests.labels_party.api.helpers import admin_client, created, download_rows, labels_csv


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "tmp/spool" not in str(p)}


def _plant(data: Path, dataset: str) -> list[Path]:
    """Leftovers as a process killed at the wrong moment leaves them."""
    hex32 = uuid.uuid4().hex
    leftovers = {
        f"datasets/{dataset}/.labels_v000002_{hex32}.parquet.{uuid.uuid4().hex}.tmp": b"half a label version",
        f"datasets/{dataset}/budget/.classes_00000009.npy.{uuid.uuid4().hex}.tmp": b"half a budget file",
        f"releases/.{hex32}.parquet.{uuid.uuid4().hex}.tmp": b"half a release",
        f"tmp/jobs/{uuid.uuid4().hex}.{uuid.uuid4().hex}/part-00000.parquet": b"a dead worker's Spark output",
        f"tmp/jobs/{uuid.uuid4().hex}.{uuid.uuid4().hex}.copy/part-0.parquet": b"a dead worker's source copy",
        f"sources/{uuid.uuid4().hex}/part-0.parquet": b"a source copied by a registration that died",
        f"tmp/duckdb-{uuid.uuid4().hex}/duckdb_temp_storage-0.tmp": b"spilled labels",
        f"tmp/{uuid.uuid4().hex}/staged.parquet": b"raw labels, parsed",
        f"tmp/{uuid.uuid4().hex}.npy": b"coverage being written",
    }
    for relative, content in leftovers.items():
        path = data / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return [data / relative for relative in leftovers]


def test_leftovers_go_at_startup_and_referenced_files_stay(tmp_path):
    ctx, client = admin_client(tmp_path)
    data = tmp_path / "data"
    dataset = client.post("/v1/datasets", json={"name": "d", "label_kind": "classes", "num_classes": 3,
                                                "epsilon_total": 5}).json()["id"]
    assert client.put(f"/v1/datasets/{dataset}/labels", content=labels_csv({f"e{i}": i % 3 for i in range(300)}),
                      headers={"Content-Type": "text/csv"}).status_code == 200
    release = created(client.post(f"/v1/datasets/{dataset}/releases", json={"mechanism": "rr", "epsilon": 1},
                                  headers={"Idempotency-Key": "r"}))
    rows = download_rows(client, {}, release["id"])
    kept = _files(data)
    assert f"releases/{release['id']}.parquet" in kept
    leftovers = _plant(data, dataset)

    make_context(f"sqlite:///{tmp_path}/db.sqlite", data).scratch.close()  # another process is live: nothing goes
    assert all(path.exists() for path in leftovers)

    ctx.scratch.close()  # the first process ends
    restarted = make_context(f"sqlite:///{tmp_path}/db.sqlite", data)
    assert [path for path in leftovers if path.exists()] == []
    assert not (data / "tmp" / "jobs").exists()
    assert sorted(p.name for p in (data / "tmp").iterdir()) == ["live.lock", "spool"]
    assert _files(data) == kept  # label versions, coverage, budget files and the committed release
    assert download_rows(client, {}, release["id"]) == rows
    restarted.scratch.close()


def test_a_release_file_the_database_does_not_know_refuses_the_start(tmp_path):
    """A release is charged — its row committed — before its file is written, so a release file without a row is
    not a crash's leftover: the database is older than the data directory (a restore, perhaps with the anchors
    removed). The service refuses to start rather than collect it and draw that release again."""
    import pytest

    from shared.errors import LabelDPError

    ctx, client = admin_client(tmp_path)
    # Spark's own scratch (shuffle blocks hold per-partition label counts) is there too, not in /tmp
    assert ctx.spark_jobs.local_dir == str((tmp_path / "data" / "tmp" / "spark").resolve())
    ctx.close()
    stray = tmp_path / "data" / "releases" / f"{uuid.uuid4().hex}.parquet"
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"privatized labels of a release the database lost")
    with pytest.raises(LabelDPError) as refused:
        make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data")
    assert refused.value.code == "ledger_rollback" and stray.exists()
