"""What one organization stores is bounded (issue 40, the twenty-seventh review: one admin filled a 400 MB disk in
50 s with 91 label versions of its own dataset, then held the last MiB with slow bodies, and every other
organization's writes were 507). At its quota an organization's label uploads and new releases (the labels party),
features tables and id lists (the trainer; its jobs: tests/features_party/test_storage.py) are 507
storage_quota_exceeded — before anything is stored, drawn or charged — while another organization's go on. ~15 s."""

from __future__ import annotations

import pandas as pd
from fastapi.testclient import TestClient
from sqlalchemy import select

import labels_party.http.api as api
from features_party.api import create_app as create_trainer
from features_party.auth import create_key as create_trainer_key
from features_party.process import make_context as trainer_context
from features_party.settings import TrainerSettings
from labels_party.http.auth import create_key
from labels_party.runtime.context import make_context
from labels_party.runtime.settings import LabelsSettings
from labels_party.store import db
from shared.service.storage_quota import org_quota
from tests.labels_party.api.helpers import bearer, created, expect_error, new_dataset, release, upload

QUOTA = 300_000


def _labels_csv(rows: int, offset: int = 0) -> str:
    return "example_id,label\n" + "".join(f"user-{offset + i:08d},{i % 10}\n" for i in range(rows))


def test_an_organization_at_its_quota_stores_and_releases_no_more_and_others_go_on(tmp_path):
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data",
                       settings=LabelsSettings(max_stored_bytes_per_org=QUOTA))
    with ctx.sessions() as session, session.begin():
        keys = {name: create_key(ctx.ledger, session, name, "admin") for name in ("filler", "other")}
    client = TestClient(api.create_app(ctx))
    filler, other = bearer(keys["filler"]), bearer(keys["other"])
    spec = {"name": "d", "label_kind": "integer", "min": 0, "max": 9, "epsilon_total": 100}
    mine, theirs = new_dataset(client, filler, **spec), new_dataset(client, other, **spec)
    versions = 0
    for attempt in range(40):  # each version of 5,000 new ids stores ~50 KB (and a release of it more)
        answer = upload(client, filler, mine, _labels_csv(5_000, attempt * 5_000))
        if answer.status_code != 200:
            break
        versions += 1
    error = expect_error(answer, 507, "storage_quota_exceeded")
    assert "max_stored_bytes_per_org" in error["message"] and f"{QUOTA:,}" in error["message"]
    assert 2 <= versions < 40
    assert client.get(f"/v1/datasets/{mine}", headers=filler).json()["label_version"] == versions  # none stored
    # its releases are stored too: once it is at its quota, a new one is refused before it is drawn or charged
    for number in range(20):
        spent = client.get(f"/v1/datasets/{mine}/budget", headers=filler).json()["epsilon_spent"]
        answer = release(client, filler, mine, f"r{number}", mechanism="rr", epsilon=1.0)
        if answer.status_code != 201:
            break
    expect_error(answer, 507, "storage_quota_exceeded")
    assert number < 20  # refused before it was drawn once what it would store is over the quota
    assert client.get(f"/v1/datasets/{mine}/budget", headers=filler).json()["epsilon_spent"] == spent  # not charged
    # another organization stores and releases as before
    assert upload(client, other, theirs, _labels_csv(5_000)).status_code == 200
    created(release(client, other, theirs, "r", mechanism="rr", epsilon=1.0))
    ctx.close()


def test_a_trainer_organization_at_its_quota_stores_no_table_or_list(tmp_path):
    """(Its jobs: tests/features_party/test_storage.py, against a labels party.)"""
    ctx = trainer_context(TrainerSettings(database_url=f"sqlite:///{tmp_path}/trainer.db", data_dir=tmp_path / "t",
                                          max_stored_bytes_per_org=QUOTA))
    with ctx.sessions() as session, session.begin():
        keys = {name: create_trainer_key(session, name, "admin") for name in ("filler", "other")}
    client = TestClient(create_trainer(ctx), raise_server_exceptions=False)
    table = pd.DataFrame({"example_id": [f"e{i:07d}" for i in range(5_000)], "x": range(5_000)}).to_csv(index=False)
    stored = 0
    for number in range(40):
        answer = client.put(f"/v1/features/t{number}", content=table,
                            headers={**bearer(keys["filler"]), "Content-Type": "text/csv"})
        if answer.status_code != 200:
            break
        stored += 1
    expect_error(answer, 507, "storage_quota_exceeded")
    assert 2 <= stored < 40
    assert len(client.get("/v1/features", headers=bearer(keys["filler"])).json()) == stored
    ids = "example_id\n" + "".join(f"i{i:08d}\n" for i in range(10_000))  # more than the room left
    listed = client.put("/v1/id-lists/l", content=ids,
                        headers={**bearer(keys["filler"]), "Content-Type": "text/csv"})
    expect_error(listed, 507, "storage_quota_exceeded")
    assert client.put("/v1/features/t", content=table, headers={**bearer(keys["other"]),
                                                                "Content-Type": "text/csv"}).status_code == 200
    ctx.close()


def test_the_default_quota_is_a_quarter_of_the_free_disk(tmp_path):
    import shutil

    assert abs(org_quota(None, tmp_path) - shutil.disk_usage(tmp_path).free // 4) < 1 << 24
    assert org_quota(12345, tmp_path) == 12345


def test_a_version_refused_as_written_leaves_no_file_behind(tmp_path):
    """The body (Parquet, 20,000 ids) is under the quota, the version it writes with its coverage (8 bytes a row)
    is not: 507 after the ingest, and neither the version nor its coverage stays (the twenty-eighth review: an
    upload that lost the commit race or was refused kept its coverage file, which no quota counted — one admin
    filled 369 MiB in 156 s while under its quota)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = [f"user-{i:08d}" for i in range(20_000)]
    body = io.BytesIO()
    pq.write_table(pa.table({"example_id": ids, "label": [i % 10 for i in range(20_000)]}), body)
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data",
                       settings=LabelsSettings(max_stored_bytes_per_org=len(body.getvalue()) + 20_000))
    with ctx.sessions() as session, session.begin():
        key = create_key(ctx.ledger, session, "filler", "admin")
    client = TestClient(api.create_app(ctx))
    dataset = new_dataset(client, bearer(key), name="d", label_kind="integer", min=0, max=9, epsilon_total=1)
    answer = upload(client, bearer(key), dataset, body.getvalue(), "application/vnd.apache.parquet")
    expect_error(answer, 507, "storage_quota_exceeded")
    stored = [p for p in (tmp_path / "data" / "datasets").rglob("*") if p.is_file()]
    pending = [p for p in (tmp_path / "data" / "tmp").glob("*.npy")]
    assert stored == [] and pending == [], (stored, pending)
    ctx.close()


def test_releases_count_their_coverage_and_datasets_their_domain(tmp_path):
    """The twenty-ninth review: an id-subset release or an evaluation keeps its coverage (8 bytes an example),
    which was uncounted (6.7 times the quota left on disk), and a dataset's domain of 100,000 listed values (~2 MB
    in the database) counted nothing (130 datasets took SQLite to 273 MB in 45 s)."""
    from labels_party.store.usage import COVERAGE_BYTES, stored_bytes

    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data",
                       settings=LabelsSettings(max_stored_bytes_per_org=3_000_000))
    with ctx.sessions() as session, session.begin():
        key = create_key(ctx.ledger, session, "filler", "admin")
    client = TestClient(api.create_app(ctx))
    admin = bearer(key)
    dataset = new_dataset(client, admin, name="d", label_kind="integer", min=0, max=9, epsilon_total=100)
    assert upload(client, admin, dataset, _labels_csv(20_000)).status_code == 200

    def used() -> int:
        with ctx.sessions() as session:
            return stored_bytes(session, ctx.store, session.scalar(select(db.Organization.id)))

    before = used()
    created(release(client, admin, dataset, "subset", mechanism="rr", epsilon=0.001,
                    example_ids=[f"user-{i:08d}" for i in range(0, 20_000, 2)]))
    assert used() - before >= COVERAGE_BYTES * 10_000
    domain = {"name": "wide", "label_kind": "finite", "values": list(range(100_000)), "epsilon_total": 1}
    codes = []
    for number in range(10):
        answer = client.post("/v1/datasets", json={**domain, "name": f"wide{number}"}, headers=admin)
        codes.append(answer.status_code)
        if answer.status_code != 201:
            break
    expect_error(answer, 507, "storage_quota_exceeded")
    assert 1 <= len(codes) - 1 < 10 and used() <= 3_000_000
    ctx.close()


def test_an_organizations_concurrent_uploads_do_not_pass_the_quota_together(tmp_path):
    """The twenty-ninth review: eight features tables at once each passed the check on what the others had not
    written yet (2.02 times the quota). An organization's uploads now store one at a time in a process."""
    import threading

    from shared.service.storage_quota import tree_bytes

    ctx = trainer_context(TrainerSettings(database_url=f"sqlite:///{tmp_path}/trainer.db", data_dir=tmp_path / "t",
                                          max_stored_bytes_per_org=QUOTA))
    with ctx.sessions() as session, session.begin():
        key = create_trainer_key(session, "filler", "admin")
    table = pd.DataFrame({"example_id": [f"e{i:07d}" for i in range(5_000)], "x": range(5_000)}).to_csv(index=False)
    codes: list[int] = []

    def put(number: int) -> None:
        client = TestClient(create_trainer(ctx), raise_server_exceptions=False)
        codes.append(client.put(f"/v1/features/c{number}", content=table,
                                headers={**bearer(key), "Content-Type": "text/csv"}).status_code)

    threads = [threading.Thread(target=put, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert 507 in codes and 200 in codes, codes
    assert tree_bytes(tmp_path / "t" / "orgs") <= QUOTA
    ctx.close()


def test_a_release_is_refused_on_what_it_would_store_and_grants_count(tmp_path):
    """The thirtieth review: a release admitted 1 byte under its organization's quota wrote 14.4 MB against 3 MB (a
    label-set release writes a column per class), and 291 grants went through at the quota. A release is now
    refused, before it is drawn or charged, when what it would store is over the room left; a grant when its rows
    would be."""
    from labels_party.store.usage import stored_bytes

    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data",
                       settings=LabelsSettings(max_stored_bytes_per_org=2_000_000))
    with ctx.sessions() as session, session.begin():
        key = create_key(ctx.ledger, session, "owner", "admin")
    client = TestClient(api.create_app(ctx))
    admin = bearer(key)
    dataset = new_dataset(client, admin, name="c", label_kind="classes", num_classes=200, epsilon_total=100)
    csv = "example_id,label\n" + "".join(f"user-{i:08d},{i % 200}\n" for i in range(5_000))
    assert upload(client, admin, dataset, csv).status_code == 200
    spent = client.get(f"/v1/datasets/{dataset}/budget", headers=admin).json()["epsilon_spent"]
    wide = release(client, admin, dataset, "wide", mechanism="subset", epsilon=1.0)  # 5,000 rows × 200 columns
    error = expect_error(wide, 507, "storage_quota_exceeded")
    assert "a new release or evaluation" in error["message"]
    assert client.get(f"/v1/datasets/{dataset}/budget", headers=admin).json()["epsilon_spent"] == spent
    created(release(client, admin, dataset, "narrow", mechanism="rr", epsilon=1.0))  # one column: it fits
    with ctx.sessions() as session:
        used = stored_bytes(session, ctx.store, session.scalar(select(db.Organization.id)))
    ctx.close()
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data",
                       settings=LabelsSettings(max_stored_bytes_per_org=used + 1_000))
    client = TestClient(api.create_app(ctx))
    grant = client.post(f"/v1/datasets/{dataset}/grants", json={"org": "someone", "epsilon": 1}, headers=admin)
    expect_error(grant, 507, "storage_quota_exceeded")
    ctx.close()


def test_a_release_not_written_yet_counts_at_what_it_will_write(tmp_path):
    """The thirty-first review: source releases answer 202 and leave their slot; queued, each counted as its row
    until its Spark job wrote the whole source — 20 of them stored 4.67 times the quota. A release that is neither
    written nor failed counts at its estimate (its examples × the version's bytes a row and a value each)."""
    from labels_party.store.usage import stored_bytes

    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data")
    with ctx.sessions() as session, session.begin():
        key = create_key(ctx.ledger, session, "owner", "admin")
    client = TestClient(api.create_app(ctx))
    admin = bearer(key)
    dataset = new_dataset(client, admin, name="d", label_kind="integer", min=0, max=9, epsilon_total=10)
    assert upload(client, admin, dataset, _labels_csv(20_000)).status_code == 200
    made = created(release(client, admin, dataset, "r", mechanism="rr", epsilon=1.0))

    def used() -> int:
        with ctx.sessions() as session:
            return stored_bytes(session, ctx.store, session.scalar(select(db.Organization.id)))

    written = used()
    with ctx.sessions() as session, session.begin():
        row = session.get(db.Release, made["id"])
        file, size = ctx.store.path(row.file), row.file_size
        row.state = "running"  # as a queued source release is, its file not written yet
    file.unlink()
    assert used() >= written - size + 20_000 * 8  # counted at an estimate of at least a value per example
    with ctx.sessions() as session, session.begin():
        session.get(db.Release, made["id"]).state = "failed"  # a failed release writes nothing
    assert used() < written - size + 20_000 * 8
    ctx.close()


def test_a_releases_estimate_reads_no_labels(tmp_path):
    """The thirty-third review: a grantee at its quota read, from its free 507's figures, the compressed size of the
    owner's label version — the owner's base rate, and often one label's change between versions. The estimate is
    now the ids' bytes and the values' room: two datasets with the same ids and different labels, and a version
    with one label changed, are refused with the same figures."""
    from labels_party.store.usage import stored_bytes

    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data")
    with ctx.sessions() as session, session.begin():
        owner = bearer(create_key(ctx.ledger, session, "owner", "admin"))
        grantee = bearer(create_key(ctx.ledger, session, "grantee", "consumer"))
    client = TestClient(api.create_app(ctx))
    ids = [f"user-{i:08d}" for i in range(5_000)]
    labels = {"zeros": [0] * 5_000, "halves": [i % 2 for i in range(5_000)], "one": [0] * 5_000}
    labels["one"][2_500] = 1
    datasets = {}
    for name, values in labels.items():
        datasets[name] = new_dataset(client, owner, name=name, label_kind="integer", min=0, max=1, epsilon_total=5)
        csv = "example_id,label\n" + "".join(f"{i},{v}\n" for i, v in zip(ids, values, strict=True))
        assert upload(client, owner, datasets[name], csv).status_code == 200
        assert client.post(f"/v1/datasets/{datasets[name]}/grants", json={"org": "grantee", "epsilon": 5},
                           headers=owner).status_code == 201
    version_sizes = set()
    with ctx.sessions() as session:
        version_sizes = {ctx.store.path(v.file).stat().st_size for v in session.scalars(select(db.LabelVersion))}
        grantee_org = session.scalar(select(db.Organization.id).where(db.Organization.name == "grantee"))
        used = stored_bytes(session, ctx.store, grantee_org)
    assert len(version_sizes) == 3  # the files' sizes differ with their labels
    ctx.close()
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data",
                       settings=LabelsSettings(max_stored_bytes_per_org=used + 1_000))
    client = TestClient(api.create_app(ctx))
    figures = set()
    for name, dataset in datasets.items():
        refused = release(client, grantee, dataset, f"r-{name}", mechanism="rr", epsilon=1.0)
        message = expect_error(refused, 507, "storage_quota_exceeded")["message"]
        figures.add(message.split(" more would be")[0].rsplit(" and ", 1)[1])
    assert len(figures) == 1, figures  # 5,000 × (13 id bytes + 4 + 8 + 8) + 4,096 for each
    assert figures == {f"{5_000 * (13 + 4 + 8 + 8) + 4_096:,}"}
    ctx.close()
