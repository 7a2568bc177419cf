"""Issue 26, item 2: an organization registers a decoy under its own prefix and swaps it for a symbolic link into
another organization's prefix. After registration the swap changes nothing (releases read the copy taken then: the
labels and the published noisy prior are the decoy's); during registration it is refused: the dataset is failed and
nothing else is created. The decoy's labels are all 1 and the other organization's all 5, so a release shows which was
read."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from labels_party.http.api import create_app
from labels_party.http.auth import create_key
from labels_party.runtime.context import make_context
from labels_party.runtime.settings import LabelsSettings
from labels_party.store import db
from shared.errors import LabelDPError
from tests.labels_party.spark.sources import read_all, register, write_source

N = 2_000
DECOY, OTHERS = 1, 5  # every label of the decoy, every label of the other organization's source


class Checkpoints:
    """The context's checkpoint: runs ``actions[name]`` once, when the service reaches ``name``."""

    def __init__(self):
        self.actions, self.reached = {}, []

    def __call__(self, name: str) -> None:
        action = self.actions.pop(name, None)
        if action is not None:
            self.reached.append(name)
            action()


@pytest.fixture()
def service(spark, tmp_path):
    ids = [f"p{i}" for i in range(N)]
    write_source(tmp_path / "clinic" / "weeks", ids, np.full(N, OTHERS, dtype=np.int64), files=1)
    write_source(tmp_path / "hospital" / "decoy", ids, np.full(N, DECOY, dtype=np.int64), files=1)
    settings = LabelsSettings(database_url=f"sqlite:///{tmp_path}/db.sqlite", data_dir=tmp_path / "data",
                              spark_sources={"hospital": [f"{tmp_path}/hospital/"],
                                             "clinic": [f"{tmp_path}/clinic/"]})
    checkpoints = Checkpoints()
    ctx = make_context(settings=settings, checkpoint=checkpoints)
    with ctx.sessions() as session, session.begin():
        key = create_key(ctx.ledger, session, "hospital", "admin")
    client = TestClient(create_app(ctx), raise_server_exceptions=False)
    return ctx, client, {"Authorization": f"Bearer {key}"}, tmp_path, checkpoints


def _register(ctx, client, headers, tmp_path):
    return register(ctx, client, headers, {
        "name": "decoy", "label_kind": "classes", "num_classes": 10, "epsilon_total": 50,
        "source": f"{tmp_path}/hospital/decoy"})


def _swap(tmp_path) -> None:
    """The decoy's file atomically replaced by a link to the other organization's file (same name)."""
    decoy = tmp_path / "hospital" / "decoy" / "part-00.parquet"
    aside = decoy.with_name(".swap")
    aside.symlink_to(tmp_path / "clinic" / "weeks" / "part-00.parquet")
    time.sleep(0.05)  # file times tick with the kernel's clock: the swap is not within the tick of the write
    os.replace(aside, decoy)


def test_a_link_swapped_in_after_registration_releases_the_decoy(service):
    ctx, client, owner, tmp_path, _ = service
    created = _register(ctx, client, owner, tmp_path)
    assert created["state"] == "ready" and created["num_examples"] == N, created
    dataset = created["id"]
    _swap(tmp_path)
    assert (tmp_path / "hospital" / "decoy" / "part-00.parquet").is_symlink()

    def release(key, request):
        response = client.post(f"/v1/datasets/{dataset}/releases", headers={**owner, "Idempotency-Key": key},
                               json=request)
        assert response.status_code == 202, response.text
        assert ctx.jobs.run_pending() == 1
        done = client.get(f"/v1/releases/{response.json()['id']}", headers=owner).json()
        assert done["state"] == "available", done
        labels = read_all(str(ctx.store.path(f"releases/{done['id']}"))).column("label").to_numpy()
        return done, labels

    # randomized response at ε 10 keeps a label with probability e¹⁰ / (e¹⁰ + 9) = 0.99959
    _, labels = release("rr", {"mechanism": "rr", "epsilon": 10})
    assert labels.size == N and np.sum(labels == DECOY) >= 0.99 * N and np.sum(labels == OTHERS) <= 5

    prior, labels = release("prior", {"mechanism": "rr-with-prior", "epsilon": 10, "prior_epsilon": 5})
    document = client.get(f"/v1/mechanisms/{prior['mechanism_hash']}", headers=owner).json()
    noisy = np.array(document["noisy_prior"]["noisy_counts"])  # drawn from the decoy's counts: 0, N, 0, ...
    exact = np.zeros(10, dtype=np.int64)
    exact[DECOY] = N
    assert noisy.shape == (10,) and np.max(np.abs(noisy - exact)) <= 10, noisy.tolist()
    # On the decoy's one-class prior RR-Top-k would keep that class alone and say nothing: the release falls back to
    # RR at ε₂ = 5, which keeps a label with probability e⁵ / (e⁵ + 9) = 0.943 (≈ 13 of 2000 become OTHERS; the
    # other organization's labels would give ≈ 1890)
    assert (document["description"]["fallback"], document["description"]["reason"]) == ("rr", "uninformative")
    assert labels.size == N and np.sum(labels == DECOY) >= 0.9 * N and np.sum(labels == OTHERS) <= 40


@pytest.mark.parametrize("point", ["source_listed", "source_opened"])
def test_a_link_swapped_in_during_registration_is_refused(service, point):
    ctx, client, owner, tmp_path, checkpoints = service
    checkpoints.actions[point] = lambda: _swap(tmp_path)
    refused = _register(ctx, client, owner, tmp_path)
    assert checkpoints.reached == [point]
    assert refused["state"] == "failed" and refused["error"]["code"] == "source_not_allowed", refused
    with ctx.sessions() as session:
        assert session.query(db.Dataset).one().source_snapshot is None
    assert not (ctx.store.root / "sources").exists()  # no copy
    assert list((ctx.store.root / "tmp" / "jobs").iterdir()) == []  # no temporary
    assert not (ctx.store.root / "datasets").exists()  # no counts


@pytest.mark.parametrize("prefix", ["{tmp}", "{tmp}/", "file://{tmp}/data", "{tmp}/data/datasets", "{tmp}/audit"])
def test_a_source_prefix_over_the_services_own_files_is_refused_at_start(tmp_path, prefix):
    """A review registered another organization's uploaded labels file (under the data directory) as its own source
    through a prefix above it: a prefix that holds, or lies in, the data or audit directory stops the service."""
    settings = LabelsSettings(database_url=f"sqlite:///{tmp_path}/db.sqlite", data_dir=tmp_path / "data",
                              audit_log_dir=tmp_path / "audit", spark_sources={"o": [prefix.format(tmp=tmp_path)]})
    with pytest.raises(LabelDPError) as refused:
        make_context(settings=settings)
    assert refused.value.code == "usage" and "overlaps the service's own files" in str(refused.value)
    beside = settings.model_copy(update={"spark_sources": {"o": [f"{tmp_path}/sources/"]}})
    make_context(settings=beside).close()


def test_a_source_and_owner_edited_while_the_registration_is_queued_copy_nothing(service):
    """Issue 40's fifth review: while the job was queued, a database writer pointed the row's source at another
    organization's files and its owner at that organization (whose prefix allows them), then set both back — the
    job copied the other organization's labels into the owner's dataset. The job copies the source its chain
    recorded, under the prefixes of the owner its chain recorded, and refuses a row that differs."""
    ctx, client, owner, tmp_path, _ = service
    created = client.post("/v1/datasets", headers=owner, json={
        "name": "decoy", "label_kind": "classes", "num_classes": 10, "epsilon_total": 50,
        "source": f"{tmp_path}/hospital/decoy"})
    assert created.status_code == 202, created.text
    dataset = created.json()["id"]
    with ctx.sessions() as session, session.begin():
        clinic = db.Organization(name="clinic")
        session.add(clinic)
        session.flush()
        row = session.get(db.Dataset, dataset)
        hospital, row.owner_org_id, row.source_uri = row.owner_org_id, clinic.id, f"{tmp_path}/clinic/weeks"
    assert ctx.jobs.run_pending() == 1
    with ctx.sessions() as session, session.begin():
        row = session.get(db.Dataset, dataset)
        row.owner_org_id, row.source_uri = hospital, f"{tmp_path}/hospital/decoy"
    refused = client.get(f"/v1/datasets/{dataset}", headers=owner).json()
    assert refused["state"] == "failed" and refused["error"]["code"] == "ledger_tampered", refused
    assert "owner differs from the chain's" in refused["error"]["message"]
    assert not (ctx.store.root / "sources").exists() and not (ctx.store.root / "datasets").exists()  # no copy
    with ctx.sessions() as session:
        assert session.get(db.Dataset, dataset).source_snapshot is None
