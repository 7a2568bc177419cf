"""Source datasets over the HTTP service: labels registered from an allowed Parquet location (202: copied and counted
by a job), released as Spark jobs — 202 and a Location, charged once before any label is written, the same ledger
and audit shape as uploaded datasets, a failing job retried and a failed one re-run by its request with the same
charge and the same noise."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from labels_party.http.api import create_app
from labels_party.http.audit import verify_audit
from labels_party.http.auth import create_key
from labels_party.ledger import documents
from labels_party.ledger.records import entries
from labels_party.releases.privatization import secret_context
from labels_party.runtime import jobs
from labels_party.runtime.context import make_context
from labels_party.runtime.settings import LabelsSettings
from labels_party.spark.jobs import privatize
from labels_party.store import db
from shared.mechanisms.documents import sampler_from_description
from tests.labels_party.spark.sources import read_parts, register, write_source

N = 20_000


class FailOnce:
    """A checkpoint that fails the first ``times`` Spark jobs at ``name`` (the crash tests' injection point)."""

    def __init__(self, name: str, times: int = 1):
        self.name, self.times, self.failed = name, times, 0

    def __call__(self, name: str) -> None:
        if name == self.name and self.failed < self.times:
            self.failed += 1
            raise RuntimeError("executor lost")


@pytest.fixture()
def service(spark, tmp_path):
    sources = tmp_path / "sources"
    rng = np.random.default_rng(7)
    labels = rng.integers(0, 10, size=N)
    write_source(sources / "weeks", [f"p{i}" for i in range(N)], labels.astype(np.int64), files=3)
    settings = LabelsSettings(database_url=f"sqlite:///{tmp_path}/db.sqlite", data_dir=tmp_path / "data",
                              spark_sources={"hospital": [f"{sources}/"]}, job_retry_seconds=0)
    checkpoint = FailOnce("spark_job_written")
    ctx = make_context(settings=settings, checkpoint=checkpoint)
    with ctx.sessions() as session, session.begin():
        keys = {"owner": create_key(ctx.ledger, session, "hospital", "admin"),
                "other": create_key(ctx.ledger, session, "clinic", "admin"),
                "publisher": create_key(ctx.ledger, session, "publisher", "consumer")}
    client = TestClient(create_app(ctx), raise_server_exceptions=False)

    def as_(who):
        return {"Authorization": f"Bearer {keys[who]}"}

    return ctx, client, as_, sources, labels, checkpoint


def _body(source, **extra):
    return {"name": "weeks", "label_kind": "integer", "min": 0, "max": 9, "epsilon_total": 3, "source": source,
            **extra}


def _create(client, headers, source, **extra):
    return client.post("/v1/datasets", headers=headers, json=_body(source, **extra))


def test_only_allowed_locations_can_be_registered(service):
    ctx, client, as_, sources, _, _ = service
    for who, location, code in [("other", f"{sources}/weeks", "source_not_allowed"),  # not this org's prefix
                                ("owner", "/etc/passwd", "source_not_allowed"),
                                ("owner", f"{sources}/../data", "source_not_allowed"),
                                ("owner", "s3a://someone-else/labels", "source_not_allowed"),
                                ("owner", "hdfs://namenode/labels", "source_not_allowed"),  # local sources only
                                ("owner", f"file://elsewhere{sources}/weeks", "source_not_allowed"),
                                ("owner", f"{sources}-other/weeks", "source_not_allowed"),  # a prefix is a directory
                                ("owner", f"{sources}/{{..,weeks}}", "source_not_allowed"),  # Spark would glob
                                ("owner", f"{sources}/%2E%2E/data", "source_not_allowed"),
                                ("owner", f"{sources}/*", "source_not_allowed")]:
        response = _create(client, as_(who), location)
        assert response.status_code == 400 and response.json()["error"]["code"] == code, response.text
    response = _create(client, as_("owner"), f"{sources}/weeks", clip={"low": 0, "high": 9}, min=None)
    assert response.status_code in (400, 422)
    with ctx.sessions() as session:
        assert session.query(db.Dataset).count() == 0  # nothing was created


def test_a_source_release_is_a_spark_job_charged_once(service, tmp_path):
    """Registration answers 202 and its job makes the dataset ready (releases before are refused, nothing charged);
    a release's job that fails is retried, then failed after job_max_attempts (charged, its error saying nothing of
    the labels); re-sent with its Idempotency-Key it is queued again and writes exactly the bytes an undisturbed run
    with the release's secret writes — one ledger record through it all."""
    ctx, client, as_, sources, labels, checkpoint = service
    checkpoint.times = 3  # the job's three attempts all fail after writing their files
    created = _create(client, as_("owner"), f"{sources}/weeks")
    assert created.status_code == 202 and created.json()["labels_at"] == "source"
    assert created.json()["state"] == "registering" and created.json()["num_examples"] == 0
    dataset = created.json()["id"]
    assert client.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 3},
                       headers=as_("owner")).status_code == 201
    early = client.post(f"/v1/datasets/{dataset}/releases", headers={**as_("publisher"), "Idempotency-Key": "early"},
                        json={"mechanism": "rr", "epsilon": 1})
    assert early.status_code == 409 and early.json()["error"]["code"] == "dataset_not_ready", early.text
    assert ctx.jobs.run_pending() == 1
    ready = client.get(f"/v1/datasets/{dataset}", headers=as_("owner")).json()
    assert ready["state"] == "ready" and ready["num_examples"] == N and ready["error"] is None  # counted by its job
    upload = client.put(f"/v1/datasets/{dataset}/labels", content="example_id,label\nx,1\n",
                        headers={**as_("owner"), "Content-Type": "text/csv"})
    assert upload.status_code == 409 and upload.json()["error"]["code"] == "source_dataset"
    subset = client.post(f"/v1/datasets/{dataset}/releases", headers={**as_("publisher"), "Idempotency-Key": "s"},
                         json={"mechanism": "rr", "epsilon": 1, "example_ids": ["p1"]})
    assert subset.status_code == 409 and subset.json()["error"]["code"] == "source_dataset"

    request = {"mechanism": "rr", "epsilon": 1}
    headers = {**as_("publisher"), "Idempotency-Key": "weekly"}
    started = client.post(f"/v1/datasets/{dataset}/releases", headers=headers, json=request)
    assert started.status_code == 202, started.text
    release = started.json()
    assert started.headers["location"] == f"/v1/releases/{release['id']}" and release["state"] == "running"
    assert release["num_examples"] == N and release["charged_epsilon"] == 1.0
    assert ctx.jobs.run_pending() == 3  # retried (job_retry_seconds 0 here), then failed
    failed = client.get(f"/v1/releases/{release['id']}", headers=as_("publisher")).json()
    assert checkpoint.failed == 3 and failed["state"] == "failed" and failed["error"]["code"] == "release_failed"
    assert "executor lost" not in json.dumps(failed)  # an internal failure's text is not echoed
    refused = client.get(f"/v1/releases/{release['id']}/labels", headers=as_("publisher"))
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "release_not_ready"
    assert not ctx.store.path(f"releases/{release['id']}").exists()  # the attempts' files went with them
    assert list(ctx.store.path(jobs.ATTEMPTS).iterdir()) == []
    with ctx.sessions() as session:
        job = jobs.job_of(session, jobs.PRIVATIZE_SOURCE, release["id"])
        assert (job.state, job.attempts, job.error_code) == ("failed", 3, "release_failed")
        secret = ctx.sealer.open(job.sealed_secret, secret_context(release["id"]))  # kept: it can run again
        document = documents.unpack(documents.stored(session, release["mechanism_hash"]))
    # what an undisturbed run with the release's secret writes (the test opens it; the service never shows it)
    reference = privatize(ctx.spark_jobs.session(), ctx.store.path(f"sources/{dataset}").resolve().as_uri(),
                          str(tmp_path / "reference"), sampler_from_description(document["description"]), secret,
                          support_values=np.arange(10, dtype=np.float64))

    again = client.post(f"/v1/datasets/{dataset}/releases", headers=headers, json=request)
    assert again.status_code == 202 and again.json()["id"] == release["id"] and again.json()["state"] == "running"
    assert ctx.jobs.run_pending() == 1
    done = client.get(f"/v1/releases/{release['id']}", headers=as_("publisher")).json()
    assert done["state"] == "available" and done["error"] is None
    second = sorted(ctx.store.path(f"releases/{release['id']}").glob("part-*.parquet"))
    first = sorted((tmp_path / "reference").glob("part-*.parquet"))
    assert len(first) == len(second) == reference.partitions
    assert [a.read_bytes() == b.read_bytes() for a, b in zip(first, second, strict=True)] == [True] * len(first)
    with ctx.sessions() as session:
        job = jobs.job_of(session, jobs.PRIVATIZE_SOURCE, release["id"])
        assert (job.state, job.sealed_secret) == ("succeeded", None)  # the secret is gone once available

    replay = client.post(f"/v1/datasets/{dataset}/releases", headers=headers, json=request)
    assert replay.status_code == 200 and replay.json()["id"] == release["id"]
    body = client.get(f"/v1/releases/{release['id']}/labels", headers=as_("publisher")).text
    rows = list(csv.DictReader(io.StringIO(body)))
    assert len(rows) == N and {r["example_id"] for r in rows} == {f"p{i}" for i in range(N)}
    released = np.array([float(r["label"]) for r in rows])
    kept = np.mean(released == labels[[int(r["example_id"][1:]) for r in rows]])
    assert abs(kept - np.e / (np.e + 9)) < 0.02  # randomized response at eps 1 over 10 labels: e / (e + 9) kept

    audit = client.get("/v1/audit", headers=as_("owner")).json()
    assert len(audit["events"]) == 1 and audit["chain_valid"]  # charged once, through failures and a re-run
    record = audit["events"][0]["record"]
    assert record["coverage"]["file"] == f"range:0:{N}" and record["examples_covered"] == N
    assert record["charge_units"] == 10**9 and record["mechanism"] == "rr"
    assert client.get(f"/v1/datasets/{dataset}/budget", headers=as_("owner")).json()["epsilon_spent"] == 1.0
    report = verify_audit(ctx)
    assert report["valid"], report
    over = client.post(f"/v1/datasets/{dataset}/releases", headers={**as_("publisher"), "Idempotency-Key": "big"},
                       json={"mechanism": "rr", "epsilon": 2.5})  # 1 + 2.5 > 3: refused before any Spark job
    assert over.status_code == 409 and over.json()["error"]["code"] == "budget_exceeded"
    assert len(client.get("/v1/audit", headers=as_("owner")).json()["events"]) == 1
    page = client.get(f"/v1/releases/{release['id']}/labels?limit=5&offset={N - 3}",
                      headers={**as_("publisher"), "Accept": "application/json"}).json()
    assert page["total"] == N and len(page["items"]) == 3 and page["next_offset"] is None

    # A file added to the source after registration is not the dataset's: its releases read the copy
    pq.write_table(pa.table({"example_id": ["q1"], "label": [3]}), sources / "weeks" / "part-99.parquet")
    later = client.post(f"/v1/datasets/{dataset}/releases", headers={**as_("publisher"), "Idempotency-Key": "n"},
                        json={"mechanism": "rr", "epsilon": 1})
    assert later.status_code == 202 and later.json()["num_examples"] == N, later.text
    assert ctx.jobs.run_pending() == 1
    assert client.get(f"/v1/releases/{later.json()['id']}", headers=as_("publisher")).json()["state"] == "available"
    assert sum(t.num_rows for t in read_parts(str(ctx.store.path(f"releases/{later.json()['id']}")))) == N


def test_where_a_source_release_ran_is_shown_to_the_owners_admins_only(service, spark):
    """A source release's job records where its Spark work ran when the release becomes available: here the tests'
    local session — its master and application id, and no executor besides the driver, which runs the tasks in local
    mode. The owner's admins see it; the consumer that requested the release sees null. The registration's job
    records where it counted the source."""
    ctx, client, as_, sources, _, checkpoint = service
    checkpoint.times = 0  # no attempt fails
    write_source(sources / "small", [f"s{i}" for i in range(100)], np.arange(100) % 10, files=2)
    dataset = register(ctx, client, as_("owner"), _body(f"{sources}/small"))["id"]
    client.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 3}, headers=as_("owner"))
    started = client.post(f"/v1/datasets/{dataset}/releases", headers={**as_("publisher"), "Idempotency-Key": "k"},
                          json={"mechanism": "rr", "epsilon": 1})
    assert started.status_code == 202 and started.json()["execution"] is None, started.text
    assert ctx.jobs.run_pending() == 1
    release = f"/v1/releases/{started.json()['id']}"

    local = {"engine": "spark", "master": spark.sparkContext.master,
             "application_id": spark.sparkContext.applicationId, "executors": 0}
    seen = client.get(release, headers=as_("owner")).json()
    assert seen["state"] == "available" and seen["execution"]["master"].startswith("local"), seen
    assert seen["execution"].pop("partitions") >= 1
    assert seen["execution"] == {**local, "rows": 100}
    requested = client.get(release, headers=as_("publisher")).json()
    assert requested["state"] == "available" and requested["execution"] is None
    with ctx.sessions() as session:
        registration = jobs.job_of(session, jobs.REGISTER_SOURCE, dataset)
        assert json.loads(registration.result_json) == local


def test_the_features_party_client_waits_for_a_source_release(service):
    """The features party's client polls a 202 release until it is available, re-sending a failed one once (the
    job's first run fails after writing: the re-run has the same charge and noise)."""
    from features_party.client import LabelsPartyClient
    from labeldp.local_services import serve_in_thread

    ctx, client, as_, sources, labels, checkpoint = service
    dataset = register(ctx, client, as_("owner"), _body(f"{sources}/weeks"))["id"]
    client.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 3}, headers=as_("owner"))
    key = as_("publisher")["Authorization"].removeprefix("Bearer ")
    checkpoint.times = 3  # every attempt fails: the release is failed, and the client sends it again once
    ctx.jobs.start()  # as `serve` does
    try:
        with serve_in_thread(create_app(ctx)) as base, LabelsPartyClient(base, key) as publisher:
            release = publisher.request_release(dataset, {"mechanism": "rr", "epsilon": 1}, poll_seconds=0.2)
            table = publisher.download_labels(release.id)
    finally:
        ctx.jobs.stop()
    assert checkpoint.failed == 3 and release.state == "available" and table.num_rows == N
    assert len(client.get("/v1/audit", headers=as_("owner")).json()["events"]) == 1


def test_refusals_at_registration_and_before_any_charge(service):
    """A link under the source and labels Spark cannot count are refused by the registration's job: the dataset is
    failed with the refusal, which its owner's admins read (no server path in it; nothing else is created, nothing
    is left in the data directory) and a granted organization sees failed without it; its releases are refused
    (dataset_not_ready) before anything is charged. A mechanism Spark cannot release and a source registered before
    sources were copied are refused before anything is charged."""
    ctx, client, as_, sources, _, _ = service
    elsewhere = sources.parent / "elsewhere"
    write_source(elsewhere, ["x1", "x2"], np.array([1, 2]), files=1)
    (sources / "link").symlink_to(elsewhere, target_is_directory=True)
    write_source(sources / "bad", ["b1", "b2", "b3"], np.array([1, 42, 3]), files=1)
    (sources / "garbage").mkdir()
    (sources / "garbage" / "part-00.parquet").write_bytes(b"not parquet" * 100)

    def body(name, location, **extra):
        body = {"name": name, "label_kind": "integer", "min": 0, "max": 9, "epsilon_total": 3, "source": location}
        if extra:
            body = {k: v for k, v in body.items() if k not in ("min", "max")} | extra
        return body

    failed = {}
    for name, code, told in [("link", "source_not_allowed", "symbolic link"), ("bad", "label_out_of_domain", "1 of 3"),
                             ("garbage", "malformed_file", "Parquet")]:
        dataset = register(ctx, client, as_("owner"), body(name, f"{sources}/{name}"))
        assert dataset["state"] == "failed" and dataset["num_examples"] == 0, dataset
        assert dataset["error"]["code"] == code, dataset
        message = dataset["error"]["message"]
        assert told in message and str(ctx.store.root) not in message and "elsewhere" not in message, message
        failed[name] = dataset["id"]
    with ctx.sessions() as session:
        assert {d.state for d in session.query(db.Dataset)} == {"failed"}
        assert {(j.state, j.attempts) for j in session.query(db.Job)} == {("failed", 1)}  # refusals: not retried
        assert session.query(db.Release).count() == 0
    assert not (ctx.store.root / "sources").exists()  # no copy
    assert list(ctx.store.path(jobs.ATTEMPTS).iterdir()) == []  # no temporary left
    assert not (ctx.store.root / "datasets").exists() or list((ctx.store.root / "datasets").rglob("*.npy")) == []
    link = failed["link"]
    assert client.post(f"/v1/datasets/{link}/grants", json={"org": "publisher", "epsilon": 1},
                       headers=as_("owner")).status_code == 201
    seen = client.get(f"/v1/datasets/{link}", headers=as_("publisher")).json()
    assert seen["state"] == "failed" and seen["error"] is None  # the refusal is the owner's
    refused = client.post(f"/v1/datasets/{link}/releases", headers={**as_("publisher"), "Idempotency-Key": "k"},
                          json={"mechanism": "rr", "epsilon": 1})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "dataset_not_ready"
    again = client.post("/v1/datasets", headers=as_("owner"), json=body("bad", f"{sources}/link"))
    assert again.status_code == 409 and again.json()["error"]["code"] == "dataset_exists"  # another request

    # the owner fixes the source and sends the same registration again: its job runs again, the dataset is ready
    (sources / "link").unlink()
    write_source(sources / "link", ["x1", "x2"], np.array([1, 2]), files=1)
    fixed = register(ctx, client, as_("owner"), body("link", f"{sources}/link"))
    assert (fixed["id"], fixed["state"], fixed["num_examples"], fixed["error"]) == (link, "ready", 2, None)

    created = register(ctx, client, as_("owner"), body("classes", f"{sources}/weeks", label_kind="classes",
                                                       num_classes=10))
    assert created["state"] == "ready", created
    dataset = created["id"]
    client.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 3}, headers=as_("owner"))

    def release(mechanism="rr", key="k"):
        return client.post(f"/v1/datasets/{dataset}/releases", headers={**as_("publisher"), "Idempotency-Key": key},
                           json={"mechanism": mechanism, "epsilon": 1})

    label_sets = release(mechanism="subset")
    assert label_sets.status_code == 400 and label_sets.json()["error"]["code"] == "mechanism_not_supported_on_spark"
    with ctx.sessions() as session, session.begin():  # as a source registered before copies were taken (0007)
        row = session.get(db.Dataset, dataset)
        row.source_snapshot = row.source_sha256 = row.source_counts_file = None
    legacy = release(key="legacy")
    assert legacy.status_code == 409 and legacy.json()["error"]["code"] == "source_dataset"
    assert "register the source again" in legacy.json()["error"]["message"]
    assert client.get("/v1/audit", headers=as_("owner")).json()["events"] == []


def test_a_withdrawn_location_is_refused_before_the_charge(service, tmp_path):
    """The review of issue 26: after the operator withdrew the owner's prefix, each release was charged and then
    failed. The location is public configuration: it is checked before anything is charged."""
    ctx, client, as_, sources, _, _ = service
    dataset = register(ctx, client, as_("owner"), _body(f"{sources}/weeks"))["id"]
    client.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 3}, headers=as_("owner"))
    ctx.close()
    withdrawn = make_context(settings=LabelsSettings(database_url=f"sqlite:///{tmp_path}/db.sqlite",
                                                     data_dir=tmp_path / "data", spark_sources={}))
    client = TestClient(create_app(withdrawn), raise_server_exceptions=False)
    for key in ("a", "b"):
        refused = client.post(f"/v1/datasets/{dataset}/releases", json={"mechanism": "rr", "epsilon": 1},
                              headers={**as_("publisher"), "Idempotency-Key": key})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "source_not_allowed", refused.text
    assert client.get(f"/v1/datasets/{dataset}/budget", headers=as_("publisher")).json()["epsilon_spent"] == 0.0
    assert client.get(f"/v1/datasets/{dataset}/releases", headers=as_("publisher")).json() == []


def test_locations_with_commas_register_and_missing_ones_are_refused_by_the_job(service):
    """Issue 28, item 7: a source path holding a comma (Hadoop reads one as a list of paths: PATH_NOT_FOUND, a 500)
    registers and is counted like any other — Spark reads the copy, named by the dataset's id — and a location that
    does not exist fails its registration with source_not_found, whose message names no path at all."""
    ctx, client, as_, sources, _, _ = service  # ~5 s once Spark runs
    location = sources / "weeks,2024"
    write_source(location, [f"q{i}" for i in range(100)], np.arange(100) % 10, files=2)
    (location / "part-01.parquet").rename(location / "part,01.parquet")  # and a file name with one
    created = register(ctx, client, as_("owner"), _body(str(location)))
    assert created["state"] == "ready" and created["num_examples"] == 100, created
    for index, missing in enumerate((f"{sources}/nowhere", f"{sources}/nowhere,else",
                                     f"{sources}/weeks,2024/part-9.parquet")):
        response = client.post("/v1/datasets", headers=as_("owner"), json=_body(missing, name=f"missing{index}"))
        ctx.jobs.run_pending()
        refused = client.get(response.headers["location"], headers=as_("owner"))
        assert refused.json()["state"] == "failed" and refused.json()["error"] == {
            "code": "source_not_found", "message": "the source location does not exist or is not readable"}
        # no part of any path: not the source's (the review saw "'nowhere,else' (at the source location ...)"), not
        # the data directory's
        for fragment in (*missing.strip("/").split("/"), *missing.split(","), str(ctx.store.root), "sources"):
            assert fragment not in response.text + refused.text, fragment


def test_a_source_registration_is_on_the_chain_and_row_edits_are_refused_before_any_charge(service):
    """Issue 40: a database writer pointed a source dataset at another dataset's copy (another organization's labels,
    charged on this budget), at fewer rows or at other counts — nothing on the chain said what was registered. The
    registration is a ``source`` fact; a release of a row that disagrees with it, or whose counts file was
    rewritten, is 503 ledger_tampered before anything is charged, and verify-audit names it."""
    ctx, client, as_, sources, _, _ = service
    write_source(sources / "other", [f"q{i}" for i in range(500)], np.zeros(500, dtype=np.int64), files=1)
    dataset = register(ctx, client, as_("owner"), _body(f"{sources}/weeks"))["id"]
    other = register(ctx, client, as_("owner"), _body(f"{sources}/other", name="other"))["id"]
    assert client.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 3},
                       headers=as_("owner")).status_code == 201
    with ctx.sessions() as session:
        facts = [e.record for e in entries(session, dataset) if e.record.get("event") == "source"]
        row, copy = session.get(db.Dataset, dataset), session.get(db.Dataset, other)
        registered = (row.source_snapshot, row.source_sha256, row.source_counts_file, row.num_examples)
        elsewhere = (copy.source_snapshot, copy.source_sha256, copy.source_counts_file, copy.num_examples)
    assert [(f["snapshot"], f["source_sha256"], f["counts_file"], f["num_examples"]) for f in facts] == [registered]
    assert verify_audit(ctx)["valid"]

    def edit(values):
        with ctx.sessions() as session, session.begin():
            row = session.get(db.Dataset, dataset)
            row.source_snapshot, row.source_sha256, row.source_counts_file, row.num_examples = values
            row.registry_size = values[3]

    counts = ctx.store.path(registered[2])
    true_counts = counts.read_bytes()
    for name, tamper, undo in (
            ("another dataset's copy", lambda: edit(elsewhere), lambda: edit(registered)),
            ("fewer rows", lambda: edit((*registered[:3], 10)), lambda: edit(registered)),
            ("rewritten counts", lambda: np.save(counts, np.full(10, N // 10, dtype=np.int64)),
             lambda: counts.write_bytes(true_counts))):
        tamper()
        refused = client.post(f"/v1/datasets/{dataset}/releases", json={"mechanism": "rr", "epsilon": 1},
                              headers={**as_("publisher"), "Idempotency-Key": name})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "ledger_tampered", (name,
                                                                                                     refused.text)
        report = verify_audit(ctx, dataset)
        found = report["datasets"][0]["problems"]
        assert not report["valid"] and any("source" in p or "registry" in p for p in found), (name, found)
        undo()
    assert client.get(f"/v1/datasets/{dataset}/budget", headers=as_("publisher")).json()["epsilon_spent"] == 0.0
    assert client.get(f"/v1/datasets/{dataset}/releases", headers=as_("publisher")).json() == []
    assert verify_audit(ctx)["valid"]


def test_migration_0018_chains_the_registration_of_a_source_dataset_registered_before(service, tmp_path):
    """A source dataset registered by an older version has no ``source`` fact (here: the fact, its anchor and its
    signed head taken back, as that version left them). The upgrade appends one, signed, once; releases then go
    ahead and verify-audit with the exported heads stays valid."""
    from sqlalchemy import text

    ctx, client, as_, sources, _, _ = service
    old = register(ctx, client, as_("owner"), _body(f"{sources}/weeks", name="old"))["id"]
    with ctx.sessions() as session, session.begin():
        last = entries(session, old)[-1]
        assert last.record["event"] == "source"
        session.execute(text("DELETE FROM ledger WHERE dataset_id = :d AND seq = :s"), {"d": old, "s": last.seq})
        session.execute(text("UPDATE datasets SET ledger_seq = :s, ledger_head = :h WHERE id = :d"),
                        {"s": last.seq - 1, "h": last.prev_hash, "d": old})
        session.execute(text("UPDATE alembic_version SET version_num = '0017'"))
    ctx.store.path(f"anchors/{old}.json").write_text(json.dumps({
        "seq": last.seq - 1, "head": last.prev_hash, "previous_seq": last.seq - 1, "previous_head": last.prev_hash}))
    log = ctx.store.path("audit") / "heads.jsonl"
    log.write_text("".join(line + "\n" for line in log.read_text().splitlines()
                           if not (json.loads(line)["dataset_id"] == old and json.loads(line)["seq"] == last.seq)))
    settings = ctx.settings
    ctx.close()
    upgraded = make_context(settings=settings, upgrade=True)
    try:
        with upgraded.sessions() as session:
            added = [e.record for e in entries(session, old) if e.seq >= last.seq]
        assert [(r["event"], r["snapshot"], r["counts_sha256"]) for r in added] == [
            ("source", last.record["snapshot"], last.record["counts_sha256"])]
        client = TestClient(create_app(upgraded), raise_server_exceptions=False)
        assert client.post(f"/v1/datasets/{old}/grants", json={"org": "publisher", "epsilon": 3},
                           headers=as_("owner")).status_code == 201
        released = client.post(f"/v1/datasets/{old}/releases", json={"mechanism": "rr", "epsilon": 1},
                               headers={**as_("publisher"), "Idempotency-Key": "after"})
        assert released.status_code == 202, released.text
        assert verify_audit(upgraded)["valid"]
    finally:
        upgraded.close()


def test_a_source_release_is_estimated_on_its_ids_and_kept_only_within_the_quota(spark, tmp_path, monkeypatch):
    """Issue 40's thirty-second review: an owner wrote its source as one zstd page of 4,000-character ids repeating
    every 300 rows — 95.5 bytes a row in the copy, ~2,760 in each release's output under Spark's own pages — and 17
    queued releases estimated on the copy stored 23.56 times the quota. The registration counts the ids' bytes, and a
    release is estimated on them (so the second one here is refused before anything is drawn or charged); a release
    whose real output would be over the quota anyway (an estimate that falls short) fails when its job is done —
    charged, its files gone."""
    from labels_party.store.usage import stored_bytes

    rows, period, length = 3_000, 300, 4_000
    rng = np.random.default_rng(11)
    stems = [rng.bytes((length - 8) // 2).hex() for _ in range(period)]
    ids = [stems[i % period] + f"{i:08d}" for i in range(rows)]
    (tmp_path / "sources" / "long").mkdir(parents=True)
    pq.write_table(pa.table({"example_id": ids, "label": np.arange(rows) % 10}),
                   tmp_path / "sources" / "long" / "part-00.parquet", compression="zstd", compression_level=9,
                   use_dictionary=False, data_page_size=1 << 30, row_group_size=1 << 30)  # one page: repeats found

    def service(quota: int):
        settings = LabelsSettings(database_url=f"sqlite:///{tmp_path}/db.sqlite", data_dir=tmp_path / "data",
                                  spark_sources={"hospital": [f"{tmp_path}/sources/"]}, job_retry_seconds=0,
                                  max_stored_bytes_per_org=quota)
        return make_context(settings=settings)

    ctx = service(10**9)
    with ctx.sessions() as session, session.begin():
        key = {"Authorization": f"Bearer {create_key(ctx.ledger, session, 'hospital', 'admin')}"}
    client = TestClient(create_app(ctx), raise_server_exceptions=False)
    dataset = register(ctx, client, key, _body(f"{tmp_path}/sources/long", epsilon_total=10))["id"]

    def used() -> int:
        with ctx.sessions() as session:
            return stored_bytes(session, ctx.store, session.scalar(select(db.Organization.id)))

    def rr(name: str):
        return client.post(f"/v1/datasets/{dataset}/releases", headers={**key, "Idempotency-Key": name},
                           json={"mechanism": "rr", "epsilon": 1})

    with ctx.sessions() as session:
        assert session.get(db.Dataset, dataset).source_id_bytes == rows * length  # counted by Spark, exactly
    copy = used()
    assert copy < rows * length / 10  # the owner's copy compresses its ids ~18-fold
    first = rr("first")
    assert first.status_code == 202, first.text
    estimate = used() - copy
    assert ctx.jobs.run_pending() == 1
    written = sum(p.stat().st_size for p in ctx.store.path(f"releases/{first.json()['id']}").rglob("*"))
    assert written > rows * length / 3  # Spark's pages hold no repeat: the ids are written again, hex-compressed
    # the estimate: their bytes (hex compresses to half in the output), a length and a value each, coverage
    assert written < estimate < 2.1 * written
    ctx.close()

    ctx = service(used() + written // 2)  # room for half of what a release writes
    client = TestClient(create_app(ctx), raise_server_exceptions=False)
    spent = client.get(f"/v1/datasets/{dataset}/budget", headers=key).json()["epsilon_spent"]
    expect = rr("refused")
    assert expect.status_code == 507 and expect.json()["error"]["code"] == "storage_quota_exceeded", expect.text
    assert client.get(f"/v1/datasets/{dataset}/budget", headers=key).json()["epsilon_spent"] == spent  # free

    from labels_party.store import usage
    # an estimate that falls short of what Spark writes (as the copy's bytes a row did before the ids were counted;
    # the ids' count is on the registration's fact now, so a test cannot set it back): the check when kept catches it
    monkeypatch.setattr(usage, "bytes_a_row", lambda id_bytes, rows: 0.0)
    late = rr("late")
    assert late.status_code == 202, late.text  # admitted on the estimate
    assert ctx.jobs.run_pending() == 1
    failed = client.get(f"/v1/releases/{late.json()['id']}", headers=key).json()
    assert failed["state"] == "failed" and failed["error"]["code"] == "storage_quota_exceeded", failed
    assert "ε stays spent" in failed["error"]["message"]
    assert client.get(f"/v1/datasets/{dataset}/budget", headers=key).json()["epsilon_spent"] == spent + 1  # charged
    assert not ctx.store.path(f"releases/{late.json()['id']}").exists()
    assert list(ctx.store.path(jobs.ATTEMPTS).iterdir()) == []
    assert used() <= ctx.storage_quota
    assert verify_audit(ctx)["valid"]
    ctx.close()


def test_a_registration_counts_while_queued_and_its_copy_is_bounded_by_the_quota(spark, tmp_path):
    """Issue 40's 33rd review: a queued registration counted its row only (ten of them stored 2.58 times the
    quota), and its job copied whatever the source held when it ran (one request's copy: 3.08 times the quota).
    Queued, a registration counts at its source's size when asked for; its copy stops at the room its
    organization has left, and the registration fails with storage_quota_exceeded, leaving no file."""
    from labels_party.store.usage import stored_bytes

    sources = tmp_path / "sources"
    write_source(sources / "grows", [f"g{i}" for i in range(2_000)], np.arange(2_000) % 10, files=1)
    source_size = sum(p.stat().st_size for p in (sources / "grows").iterdir())
    settings = LabelsSettings(database_url=f"sqlite:///{tmp_path}/db.sqlite", data_dir=tmp_path / "data",
                              spark_sources={"hospital": [f"{sources}/"]}, job_retry_seconds=0,
                              max_stored_bytes_per_org=20 * source_size + 200_000)
    ctx = make_context(settings=settings)
    with ctx.sessions() as session, session.begin():
        key = {"Authorization": f"Bearer {create_key(ctx.ledger, session, 'hospital', 'admin')}"}
    client = TestClient(create_app(ctx), raise_server_exceptions=False)

    def used() -> int:
        with ctx.sessions() as session:
            return stored_bytes(session, ctx.store, session.scalar(select(db.Organization.id)))

    before = used()
    created = _create(client, key, f"{sources}/grows")
    assert created.status_code == 202, created.text
    assert used() - before >= source_size  # queued: counted at the source's size
    rng = np.random.default_rng(5)  # the owner grows its source past the quota before the job runs
    for k in range(1, 30):
        write_source(sources / "grows" / f"more-{k}", [f"g{k}-{i}" for i in range(2_000)],
                     rng.integers(0, 10, 2_000), files=1)
    assert ctx.jobs.run_pending() == 1
    failed = client.get(f"/v1/datasets/{created.json()['id']}", headers=key).json()
    assert failed["state"] == "failed" and failed["error"]["code"] == "storage_quota_exceeded", failed
    assert not (ctx.store.root / "sources").exists() or not any((ctx.store.root / "sources").iterdir())
    assert list(ctx.store.path(jobs.ATTEMPTS).iterdir()) == []
    assert used() - before < 20_000  # failed: its row and domain only
    ctx.close()


def test_a_copy_takes_no_more_than_its_request_counted_and_a_request_again_counts_anew(spark, tmp_path):
    """Issue 40's 34th review: each running registration's copy could take all the room its organization had left
    (four at once: 2.06 times the quota in flight). A copy takes at most what its request counted (and 1 MiB): a
    source that grew since fails to register, whatever the quota; sent again, the request counts it as it is."""
    sources = tmp_path / "sources"
    write_source(sources / "grows", [f"g{i}" for i in range(2_000)], np.arange(2_000) % 10, files=1)
    settings = LabelsSettings(database_url=f"sqlite:///{tmp_path}/db.sqlite", data_dir=tmp_path / "data",
                              spark_sources={"hospital": [f"{sources}/"]}, job_retry_seconds=0,
                              max_stored_bytes_per_org=10**9)
    ctx = make_context(settings=settings)
    with ctx.sessions() as session, session.begin():
        key = {"Authorization": f"Bearer {create_key(ctx.ledger, session, 'hospital', 'admin')}"}
    client = TestClient(create_app(ctx), raise_server_exceptions=False)
    created = _create(client, key, f"{sources}/grows")
    assert created.status_code == 202, created.text
    rng = np.random.default_rng(9)  # 2 MB more after the request: random ids, incompressible
    pq.write_table(pa.table({"example_id": [rng.bytes(32).hex() for _ in range(30_000)],
                             "label": rng.integers(0, 10, 30_000)}), sources / "grows" / "part-99.parquet")
    assert ctx.jobs.run_pending() == 1
    failed = client.get(f"/v1/datasets/{created.json()['id']}", headers=key).json()
    assert failed["state"] == "failed" and failed["error"]["code"] == "storage_quota_exceeded", failed
    again = _create(client, key, f"{sources}/grows")  # the same request: re-queued, counted anew
    assert again.status_code == 202 and again.json()["id"] == created.json()["id"], again.text
    assert ctx.jobs.run_pending() == 1
    ready = client.get(f"/v1/datasets/{created.json()['id']}", headers=key).json()
    assert ready["state"] == "ready" and ready["num_examples"] == 32_000, ready
    ctx.close()


def test_a_queued_source_release_runs_only_the_document_its_chain_stated(service):
    """Issue 40's thirty-fifth review: while a source release waited for its job, a database writer pointed its row
    and its job's spec at the mechanism document of an ε=8 release, and the job ran it — labels at ε=8 for a charge of
    ε=1 — and made it available as the row said. The document is on the chain when the release is queued: the read
    of the edited row is refused, the job refuses to run another document (the release fails, charged, with no
    labels), and a restart refuses the row."""
    from sqlalchemy import text

    from labels_party.ledger.agreement import LedgerTampered
    ctx, client, as_, sources, _, checkpoint = service
    checkpoint.times = 0
    dataset = register(ctx, client, as_("owner"), _body(f"{sources}/weeks", epsilon_total=10))["id"]

    def rr(name: str, epsilon: float):
        return client.post(f"/v1/datasets/{dataset}/releases", headers={**as_("owner"), "Idempotency-Key": name},
                           json={"mechanism": "rr", "epsilon": epsilon})

    strong = rr("strong", 8)
    assert strong.status_code == 202 and ctx.jobs.run_pending() == 1
    strong_hash = client.get(f"/v1/releases/{strong.json()['id']}", headers=as_("owner")).json()["mechanism_hash"]
    weak = rr("weak", 1).json()
    assert weak["state"] == "running" and weak["mechanism_hash"] != strong_hash
    with ctx.sessions() as session, session.begin():
        session.execute(text("UPDATE releases SET mechanism_hash = :s WHERE id = :w"), {"s": strong_hash,
                                                                                        "w": weak["id"]})
        session.execute(text("UPDATE jobs SET spec_json = replace(spec_json, :own, :s) WHERE subject_id = :w"),
                        {"own": weak["mechanism_hash"], "s": strong_hash, "w": weak["id"]})
    refused = client.get(f"/v1/releases/{weak['id']}", headers=as_("owner"))
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "ledger_tampered", refused.text
    assert "differs from the one the chain stated before it was computed" in refused.json()["error"]["message"]
    assert ctx.jobs.run_pending() == 1
    with ctx.sessions() as session:
        release = session.get(db.Release, weak["id"])
        assert release.state == "failed" and json.loads(release.error_json)["code"] == "invalid_mechanism_document"
    assert not ctx.store.path(f"releases/{weak['id']}").exists()  # nothing was drawn, nothing is served
    assert client.get(f"/v1/datasets/{dataset}/budget", headers=as_("owner")).json()["epsilon_spent"] == 9  # charged
    ctx.close()
    with pytest.raises(LedgerTampered, match="differs from the one the chain stated before it was computed"):
        make_context(settings=ctx.settings)


def test_an_available_source_release_never_draws_again_and_its_job_writes_only_its_own_files(service, tmp_path):
    """The thirty-sixth review: a database writer put back an available source release's sealed secret (read while
    it was queued), set its row to failed and its job's splits to others; the consumer's request sent again re-ran the
    job — a second draw, served, for one charge. And a job took its release's file from the row: pointed outside the
    data directory, it deleted what was there. Now the chain's availability ends the release's draws (the request
    sent again is 503 ``ledger_tampered``, nothing appended), the splits and support are the chain's, and a job
    refuses a row that names any file but its own (the directory named stays)."""
    from sqlalchemy import text

    ctx, client, as_, sources, _, checkpoint = service
    checkpoint.times = 0
    dataset = register(ctx, client, as_("owner"), _body(f"{sources}/weeks", epsilon_total=10))["id"]

    def rr(name: str):
        return client.post(f"/v1/datasets/{dataset}/releases", headers={**as_("owner"), "Idempotency-Key": name},
                           json={"mechanism": "rr", "epsilon": 1})

    first = rr("first").json()
    with ctx.sessions() as session:
        job = jobs.job_of(session, jobs.PRIVATIZE_SOURCE, first["id"])
        sealed, spec = job.sealed_secret, json.loads(job.spec_json)
    assert set(spec) == {"release_id", "dataset_id", "mechanism_hash", "source_sha256"}  # the rest is the chain's
    with ctx.sessions() as session, session.begin():  # splits and a support that are not the chain's: not read
        session.execute(text("UPDATE jobs SET spec_json = :s WHERE subject_id = :r"), {
            "s": json.dumps({**spec, "support": [0, 1], "max_partition_bytes": 1, "min_partitions": 9}),
            "r": first["id"]})
    assert ctx.jobs.run_pending() == 1
    assert client.get(f"/v1/releases/{first['id']}", headers=as_("owner")).json()["state"] == "available"
    with ctx.sessions() as session:
        seq = session.get(db.Dataset, dataset).ledger_seq
    with ctx.sessions() as session, session.begin():
        session.execute(text("UPDATE releases SET state = 'failed' WHERE id = :r"), {"r": first["id"]})
        session.execute(text("UPDATE jobs SET sealed_secret = :s, state = 'failed' WHERE subject_id = :r"),
                        {"s": sealed, "r": first["id"]})
    again = rr("first")
    assert again.status_code == 503 and again.json()["error"]["code"] == "ledger_tampered", again.text
    assert ctx.jobs.run_pending() == 0
    with ctx.sessions() as session:
        assert session.get(db.Dataset, dataset).ledger_seq == seq  # no second availability
        session.execute(text("UPDATE releases SET state = 'available' WHERE id = :r"), {"r": first["id"]})
        session.commit()

    outside = tmp_path / "precious"
    (outside / "keep").mkdir(parents=True)
    second = rr("second").json()
    with ctx.sessions() as session, session.begin():
        session.execute(text("UPDATE releases SET file = :f WHERE id = :r"),
                        {"f": f"releases/../../{outside.name}", "r": second["id"]})
    assert ctx.jobs.run_pending() == 3  # refused (ledger_tampered) at each attempt, then failed
    assert (outside / "keep").is_dir()  # not removed, nothing renamed into it
    with ctx.sessions() as session:
        assert session.get(db.Release, second["id"]).state == "failed"
    assert not ctx.store.path(f"releases/{second['id']}").exists()
