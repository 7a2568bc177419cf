"""Release quotas over HTTP (labels_party/runtime/quotas.py): an organization over its release-seconds gets 429
``release_quota_exceeded`` with ``Retry-After`` before anything is charged, its earlier release still replays,
and another organization is not affected; 30 concurrent requests of one organization on a real server never
compute more than its slots at once, and each refused one is charged nothing; the OpenAPI lists the quota and
capacity answers; a release whose key is revoked while it waits for its organization's slot is refused at the
charge (401, nothing charged). Runtime: about 10 s."""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sqlalchemy import select

from labeldp.local_services import serve_in_thread
from labels_party.http.api import create_app
from labels_party.http.audit import verify_audit
from labels_party.http.auth import KEYS, create_key
from labels_party.runtime.context import make_context
from labels_party.runtime.settings import LabelsSettings
from labels_party.store import db
from shared.service.keys import UNAUTHORIZED_MESSAGE, KeyRef
from tests.labels_party.api.helpers import (
    created,
    expect_error,
    labels_csv,
    new_dataset,
    release,
    state,
    upload,
)


@pytest.fixture
def ctx(db_url, data_dir):
    # A bucket that one release empties (a release holds its slot milliseconds at least), refilled over an hour.
    return make_context(db_url, data_dir, settings=LabelsSettings(release_seconds=0.001,
                                                                   release_window_seconds=3600))


def test_an_organization_over_its_time_quota_is_refused_before_the_charge(client, admin, consumer, dataset,
                                                                         dataset_small):
    first = created(release(client, consumer, dataset, "k1", mechanism="rr", epsilon=0.5))
    before = state(client, admin, dataset)
    refused = release(client, consumer, dataset, "k2", mechanism="rr", epsilon=0.5)
    error = expect_error(refused, 429, "release_quota_exceeded")
    assert "seconds of release computation" in error["message"] and "nothing was charged" in error["message"]
    # Until the bucket holds a second again: at 0.001 s per hour, more than an hour.
    assert int(refused.headers["Retry-After"]) > 3600
    assert state(client, admin, dataset) == before  # no charge, no ledger record
    replay = release(client, consumer, dataset, "k1", mechanism="rr", epsilon=0.5)
    assert replay.status_code == 200 and replay.json()["id"] == first["id"]  # a replay computes nothing
    # Another organization's bucket is its own (the owner's account of the dataset without a grant).
    created(release(client, admin, dataset_small, "k3", mechanism="rr", epsilon=0.5))


def test_the_openapi_lists_quota_and_capacity_answers(client):
    spec = client.get("/openapi.json").json()
    operation = spec["paths"]["/v1/datasets/{dataset_id}/releases"]["post"]
    for status in ("429", "503"):
        assert "Retry-After" in operation["responses"][status]["headers"]
    assert "release_quota_exceeded" in operation["responses"]["429"]["description"]
    assert "release_capacity_exhausted" in operation["responses"]["503"]["description"]
    assert "body_timeout" in operation["responses"]["408"]["description"]
    # This deployment's values (the fixture's time quota, the default HTTP limits).
    assert "0.001 seconds of release computation per 3600 s" in spec["info"]["description"]
    assert "2 releases computed at once" in spec["info"]["description"]
    assert "within 10 s of the connection" in spec["info"]["description"]


class _Computing:
    """A checkpoint that counts the releases between their charge and their finish (the computation)."""

    def __init__(self) -> None:
        self.now = self.most = 0
        self._lock = threading.Lock()

    def __call__(self, name: str) -> None:
        with self._lock:
            if name == "after_charge_commit":
                self.now += 1
                self.most = max(self.most, self.now)
            elif name == "after_finish_commit":
                self.now -= 1
        if name == "after_charge_commit":
            time.sleep(0.2)  # a release that takes a while: the others must queue


def _shared_dataset(client, admin, *, epsilon_total: float, granted: float) -> str:
    """200 labels 0..9 of the owner's, ``granted`` of every example's ε allocated to the organization 'partner'."""
    dataset = new_dataset(client, admin, name="d", label_kind="integer", min=0, max=9, epsilon_total=epsilon_total)
    assert upload(client, admin, dataset, labels_csv({f"e{i}": i % 10 for i in range(200)})).status_code == 200
    assert client.post(f"/v1/datasets/{dataset}/grants", json={"org": "partner", "epsilon": granted},
                       headers=admin).status_code == 201
    return dataset


def test_concurrent_releases_of_one_organization_are_limited_to_its_slots(tmp_path):
    computing = _Computing()
    settings = LabelsSettings(release_slots_per_org=2, release_slots=4, release_queue_seconds=1)
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data", settings=settings,
                       checkpoint=computing)
    with ctx.sessions() as session, session.begin():
        admin = {"Authorization": f"Bearer {create_key(ctx.ledger, session, 'owner', 'admin')}"}
        consumer = {"Authorization": f"Bearer {create_key(ctx.ledger, session, 'partner', 'consumer')}"}
    with serve_in_thread(create_app(ctx)) as base, httpx.Client(base_url=base, timeout=60) as client:
        dataset = _shared_dataset(client, admin, epsilon_total=100, granted=100)

        def attempt(i: int) -> httpx.Response:
            return client.post(f"/v1/datasets/{dataset}/releases", json={"mechanism": "rr", "epsilon": 1},
                               headers={**consumer, "Idempotency-Key": f"k{i}"})

        with ThreadPoolExecutor(max_workers=30) as pool:
            responses = list(pool.map(attempt, range(30)))
        statuses = [r.status_code for r in responses]
        spent = client.get(f"/v1/datasets/{dataset}/budget", headers=consumer).json()["epsilon_spent"]
    assert computing.most == 2  # never more than the organization's two slots at once
    admitted, refused = statuses.count(201), [r for r in responses if r.status_code == 429]
    assert admitted + len(refused) == 30 and admitted >= 2 and refused, statuses
    assert {r.json()["error"]["code"] for r in refused} == {"release_quota_exceeded"}
    assert all(int(r.headers["Retry-After"]) >= 1 for r in refused)
    assert spent == float(admitted)  # exactly the admitted ones are charged (ε = 1 each)
    assert verify_audit(ctx)["valid"]


def test_a_key_revoked_while_its_release_waits_for_a_slot_is_refused_with_nothing_charged(tmp_path):
    """The hostile review's sequence: a consumer's release waits behind its organization's slot (held here, as
    another release of the organization would), the operator revokes the key meanwhile (its fact on the chain),
    then the slot frees: the waiting release is the same 401 as any invalid key, and nothing is charged."""
    settings = LabelsSettings(release_slots_per_org=1, release_queue_seconds=30)
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data", settings=settings)
    keys = dataclasses.replace(KEYS, audit=ctx.ledger.key_changed)  # as `labeldp labels revoke-key` binds it
    with ctx.sessions() as session, session.begin():
        admin = {"Authorization": f"Bearer {create_key(ctx.ledger, session, 'owner', 'admin')}"}
        issued = keys.issue(session, "partner", "consumer")
        consumer = {"Authorization": f"Bearer {issued.secret}"}
        org_id = session.scalar(select(db.Organization.id).where(db.Organization.name == "partner"))
    with serve_in_thread(create_app(ctx)) as base, httpx.Client(base_url=base, timeout=60) as client:
        dataset = _shared_dataset(client, admin, epsilon_total=10, granted=5)
        created(release(client, consumer, dataset, "first", mechanism="rr", epsilon=1))  # the key works
        with ThreadPoolExecutor(max_workers=1) as pool:
            with ctx.quotas.slot(org_id):  # the organization's one slot, taken by "another release"
                waiting = pool.submit(release, client, consumer, dataset, "queued", mechanism="rr", epsilon=1)
                deadline = time.monotonic() + 10
                while not ctx.quotas._waiting[org_id]:  # admitted (the key checked) and queued for the slot
                    assert time.monotonic() < deadline and not waiting.done(), "the release never queued"
                    time.sleep(0.01)
                with ctx.sessions() as session, session.begin():
                    keys.revoke(session, KeyRef(id=issued.info.id), by="ops")
                before = state(client, admin, dataset)  # with the revocation's fact, before the slot frees
                assert not waiting.done()
            refused = waiting.result(timeout=30)
        error = expect_error(refused, 401, "unauthorized")
        assert error["message"] == UNAUTHORIZED_MESSAGE  # the very answer of an unknown key
        assert state(client, admin, dataset) == before  # no charge, no ledger record
        chain = client.get("/v1/audit", params={"dataset": dataset}, headers=admin).json()
        assert chain["facts"][-1]["record"]["change"] == "revoked"
        assert [e["record"]["release_id"] for e in chain["events"]] == [
            client.get(f"/v1/datasets/{dataset}/releases", headers=admin).json()[0]["id"]]  # the first alone
        assert len(client.get(f"/v1/datasets/{dataset}/releases", headers=admin).json()) == 1
        assert client.get(f"/v1/datasets/{dataset}/budget", headers=admin).json()["epsilon_spent"] == 1.0
    report = verify_audit(ctx)
    assert report["valid"], report
