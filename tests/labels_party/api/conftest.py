"""Fixtures of the labels-party API tests: a context on a fresh SQLite database, four keys (an admin, a granted
consumer, a consumer never granted anything, another organization's admin), a TestClient, and datasets with labels."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

with warnings.catch_warnings():  # starlette: "Using `httpx` with `starlette.testclient` is deprecated"
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from labels_party.http.api import create_app
from labels_party.http.auth import create_key
from labels_party.runtime.context import make_context
from tests.labels_party.api.helpers import NUM_LABELS, bearer, labels_csv, new_dataset, upload


@pytest.fixture
def db_url(tmp_path):
    return f"sqlite:///{tmp_path}/db.sqlite"


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "data"


@pytest.fixture
def ctx(db_url, data_dir):
    return make_context(db_url, data_dir)


@pytest.fixture
def keys(ctx):
    with ctx.sessions() as s, s.begin():
        return {
            "admin": create_key(ctx.ledger, s, "hospital", "admin"),
            "consumer": create_key(ctx.ledger, s, "publisher", "consumer"),
            "stranger": create_key(ctx.ledger, s, "adnet", "consumer"),  # a consumer that is never granted anything
            "other_admin": create_key(ctx.ledger, s, "clinic", "admin"),  # the admin of another organization
        }


@pytest.fixture
def admin(keys):
    return bearer(keys["admin"])


@pytest.fixture
def consumer(keys):
    return bearer(keys["consumer"])


@pytest.fixture
def stranger(keys):
    return bearer(keys["stranger"])


@pytest.fixture
def other_admin(keys):
    return bearer(keys["other_admin"])


@pytest.fixture
def client(ctx):
    # raise_server_exceptions=False: a bug must show up as the 500 JSON answer a real client would get.
    with TestClient(create_app(ctx), raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.fixture
def labels():
    """The true labels of the main dataset: example id -> integer label in 1..52."""
    values = np.random.default_rng(20240601).integers(1, 53, size=NUM_LABELS)
    return {f"e{i}": int(v) for i, v in enumerate(values)}


@pytest.fixture
def dataset(client, admin, labels):
    """Integer labels 1..52, ε_total = 3, 2000 uploaded labels, granted to the consumer's org."""
    dataset_id = new_dataset(client, admin, name="weeks", label_kind="integer", min=1, max=52, epsilon_total=3)
    r = upload(client, admin, dataset_id, labels_csv(labels))
    assert r.status_code == 200, r.text
    assert r.json()["num_examples"] == NUM_LABELS
    r = client.post(f"/v1/datasets/{dataset_id}/grants", json={"org": "publisher", "epsilon": 3}, headers=admin)
    assert r.status_code == 201, r.text
    return dataset_id


@pytest.fixture
def dataset_small(client, admin, labels):
    """ε_total = 1, 300 integer labels, no grant."""
    dataset_id = new_dataset(client, admin, name="small", label_kind="integer", min=1, max=52, epsilon_total=1)
    r = upload(client, admin, dataset_id, labels_csv(dict(list(labels.items())[:300])))
    assert r.status_code == 200, r.text
    return dataset_id
