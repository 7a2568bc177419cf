"""50 concurrent releases against a budget that admits 10, on a real uvicorn server (SQLite and PostgreSQL)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from sqlalchemy import select

from labeldp.local_services import serve_in_thread
from labels_party.http.api import create_app
from labels_party.http.audit import verify_audit
from labels_party.http.auth import authenticate, create_key
from labels_party.runtime.context import make_context
from labels_party.runtime.settings import LabelsSettings
from labels_party.store import db
from tests.support.databases import POSTGRES_URL, fresh_database


def _setup(base: str, admin: str, epsilon_total: float, n: int = 400) -> str:
    headers = {"Authorization": f"Bearer {admin}"}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
        dataset = client.post("/v1/datasets", json={"name": "hours", "label_kind": "integer", "min": 0,
                                                    "max": 99, "epsilon_total": epsilon_total}).json()["id"]
        labels = np.random.default_rng(0).integers(0, 100, size=n)
        body = "example_id,label\n" + "\n".join(f"x{i},{v}" for i, v in enumerate(labels))
        assert client.put(f"/v1/datasets/{dataset}/labels", content=body,
                          headers={"Content-Type": "text/csv"}).status_code == 200
        grant = {"org": "partner", "epsilon": epsilon_total}
        assert client.post(f"/v1/datasets/{dataset}/grants", json=grant).status_code == 201
    return dataset


@pytest.mark.parametrize("mechanism", ["rr", "opt-unbiased"])
def test_fifty_concurrent_releases_exactly_ten_fit(database_url, tmp_path, mechanism):
    # The ledger under concurrency, not the quotas (tests/labels_party/api/test_quotas.py): all 50 may compute at once.
    quotas = LabelsSettings(release_slots_per_org=50, release_slots=50)
    ctx = make_context(database_url, tmp_path / "data", settings=quotas)
    with ctx.sessions() as session, session.begin():
        admin = create_key(ctx.ledger, session, "owner", "admin")
        consumer = create_key(ctx.ledger, session, "partner", "consumer")
    with serve_in_thread(create_app(ctx)) as base:
        dataset = _setup(base, admin, epsilon_total=1.0)
        body = {"mechanism": mechanism, "epsilon": 0.1}
        if mechanism == "opt-unbiased":
            body["mesh"] = 20

        def attempt(i: int) -> httpx.Response:
            with httpx.Client(base_url=base, timeout=120) as client:
                return client.post(f"/v1/datasets/{dataset}/releases", json=body,
                                   headers={"Authorization": f"Bearer {consumer}", "Idempotency-Key": f"k{i}"})

        with ThreadPoolExecutor(max_workers=50) as pool:
            responses = list(pool.map(attempt, range(50)))
        statuses = sorted(r.status_code for r in responses)
        assert statuses.count(201) == 10, statuses
        assert statuses.count(409) == 40
        assert {r.json()["error"]["code"] for r in responses if r.status_code == 409} == {"budget_exceeded"}
        charged = sum(r.json()["epsilon"] for r in responses if r.status_code == 201)
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {admin}"}) as client:
            budget = client.get(f"/v1/datasets/{dataset}/budget").json()
            audit = client.get("/v1/audit", params={"dataset": dataset}).json()
    assert charged == pytest.approx(1.0)
    assert budget["epsilon_spent"] == 1.0 and budget["epsilon_remaining"] == 0.0  # exact: no float sum, no tolerance
    with ctx.sessions() as session:
        assert session.get(db.Dataset, dataset).epsilon_spent_units == 10 * 100_000_000
    assert len(audit["events"]) == 10 and audit["chain_valid"]
    # the dataset's totals, allocations, keys, labels and grant come before any release; then each release's charge
    # and, later, its availability: 20 entries after the setup's, one per seq
    available = [f for f in audit["facts"] if f["record"]["event"] == "release_available"]
    setup = len(audit["facts"]) - len(available)
    assert len(available) == 10
    assert sorted(e["seq"] for e in audit["events"] + available) == list(range(setup + 1, setup + 21))
    assert {f["record"]["release_id"] for f in available} == {r.json()["id"] for r in responses
                                                                if r.status_code == 201}
    assert verify_audit(ctx)["valid"]


@pytest.mark.skipif(not POSTGRES_URL, reason="READ COMMITTED readers run beside writers on PostgreSQL only (SQLite's "
                                             "BEGIN IMMEDIATE serializes every transaction)")
def test_a_reader_that_read_the_dataset_before_other_charges_committed_is_not_told_tampered(tmp_path):
    # What two replicas hit under load (CI): a release's first transaction reads the dataset row without its lock,
    # other releases commit and move the anchor on, then it checks the anchor and replays the chain.
    with fresh_database("postgresql", tmp_path) as url:
        ctx = make_context(url, tmp_path / "data")
        with ctx.sessions() as session, session.begin():
            admin = create_key(ctx.ledger, session, "owner", "admin")
            consumer = create_key(ctx.ledger, session, "partner", "consumer")
        with serve_in_thread(create_app(ctx)) as base:
            dataset_id = _setup(base, admin, epsilon_total=1.0)
            with ctx.sessions() as reader, reader.begin():
                dataset = reader.get(db.Dataset, dataset_id)  # the row as it stood before the releases below
                stale_seq = dataset.ledger_seq
                version = reader.scalar(select(db.LabelVersion).where(db.LabelVersion.dataset_id == dataset_id))
                principal = authenticate(reader, f"Bearer {admin}", ctx.ledger)
                with httpx.Client(base_url=base, timeout=120) as client:
                    for i in range(3):
                        assert client.post(f"/v1/datasets/{dataset_id}/releases", json={"mechanism": "rr",
                                                                                         "epsilon": 0.1},
                                           headers={"Authorization": f"Bearer {consumer}",
                                                    "Idempotency-Key": f"k{i}"}).status_code == 201
                file, coverage = ctx.ledger.labels_read(reader, dataset, version)
                ctx.ledger.check_actor(reader, dataset, principal)
                assert dataset.ledger_seq == stale_seq + 6  # read again: three charges, three availabilities
                assert coverage.size == 400 and file == version.file
