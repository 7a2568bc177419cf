"""Declared label clipping: a dataset's public preprocessing moves out-of-range labels to its bounds at upload and
says how many, in the response and in the audit; without it, out-of-range labels are refused as before."""

from __future__ import annotations

import numpy as np
import pytest

from tests.labels_party.api.helpers import (
    created,
    download_rows,
    expect_error,
    labels_csv,
    new_dataset,
    release,
    state,
    upload,
)

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")

PRICES = {f"sale-{i}": price for i, price in enumerate([-3.0, 0.0, 120.5, 15002.0, 999.25, 20000.0, 7.0, 14999.0])}


def test_clip_declared_at_creation_clips_uploads_and_counts(client, admin):
    dataset_id = new_dataset(client, admin, name="prices", label_kind="continuous", clip={"low": 0, "high": 15000},
                             grid_size=1000, epsilon_total=4)
    shown = client.get(f"/v1/datasets/{dataset_id}", headers=admin).json()["domain"]
    assert shown == {"kind": "continuous", "min": 0.0, "max": 15000.0, "grid_size": 1000,
                     "clip": {"low": 0.0, "high": 15000.0}}
    r = upload(client, admin, dataset_id, labels_csv(PRICES))
    assert r.status_code == 200, r.text
    assert (r.json()["clipped_below"], r.json()["clipped_above"], r.json()["num_examples"]) == (1, 2, 8)

    audit = client.get("/v1/audit", params={"dataset": dataset_id}, headers=admin).json()
    assert [(u["label_version"], u["num_examples"], u["clipped_below"], u["clipped_above"])
            for u in audit["uploads"]] == [(1, 8, 1, 2)]
    released = created(release(client, admin, dataset_id, "c1", mechanism="laplace", epsilon=1.0))
    assert released["num_examples"] == 8
    steps = np.array([value for _, value in download_rows(client, admin, released["id"])]) / (15000 / 999)
    assert np.allclose(steps, np.round(steps), atol=1e-6)  # released on the declared grid


def test_clipped_labels_are_the_bounds(ctx, client, admin):
    """What is stored after the clip: the bounds exactly (read back through the service's own storage)."""
    import json

    from labels_party.store import db

    dataset_id = new_dataset(client, admin, name="counts", label_kind="integer", clip={"low": 1, "high": 52},
                             epsilon_total=1)
    upload(client, admin, dataset_id, labels_csv({"a": 0, "b": 1, "c": 60, "d": 52, "e": 30}))
    with ctx.sessions() as session:
        version = session.query(db.LabelVersion).filter_by(dataset_id=dataset_id).one()
        assert json.loads(session.get(db.Dataset, dataset_id).domain_json)["clip"] == {"low": 1.0, "high": 52.0}
    stored = ctx.store.read_table(version.file).column("label").to_numpy()
    assert sorted(stored.tolist()) == [1.0, 1.0, 30.0, 52.0, 52.0]
    assert (version.clipped_below, version.clipped_above) == (1, 1)


def test_without_clip_out_of_range_is_refused_with_numbers_as_numbers(client, admin):
    dataset_id = new_dataset(client, admin, name="strict", label_kind="continuous", min=0, max=15000, epsilon_total=1)
    before = state(client, admin, dataset_id)
    error = expect_error(upload(client, admin, dataset_id, labels_csv(PRICES)), 400, "label_out_of_domain")
    assert "e.g. -3" in error["message"] and "np." not in error["message"] and "float64" not in error["message"]
    assert state(client, admin, dataset_id) == before


def test_integer_labels_out_of_range_and_not_integers(client, admin):
    dataset_id = new_dataset(client, admin, name="ints", label_kind="integer", clip={"low": 0, "high": 10},
                             epsilon_total=1)
    before = state(client, admin, dataset_id)
    # the clip moves out-of-range labels; a non-integer inside the range is still not an integer label
    error = expect_error(upload(client, admin, dataset_id, labels_csv({"a": 3.5, "b": 40})), 400,
                         "label_out_of_domain")
    assert "3.5" in error["message"]
    assert state(client, admin, dataset_id) == before


def test_integer_range_on_a_grid(client, admin):
    """Prices in dollars: an integer range too wide for the finite mechanisms, released on a grid instead."""
    dataset_id = new_dataset(client, admin, name="dollars", label_kind="integer", clip={"low": 0, "high": 18_500},
                             grid_size=1000, epsilon_total=2)
    domain = client.get(f"/v1/datasets/{dataset_id}", headers=admin).json()["domain"]
    assert domain == {"kind": "continuous", "min": 0.0, "max": 18500.0, "grid_size": 1000,
                      "clip": {"low": 0.0, "high": 18500.0}}
    rng = np.random.default_rng(3)
    prices = {f"p{i}": int(v) for i, v in enumerate(rng.lognormal(7.5, 1.0, size=400))}
    r = upload(client, admin, dataset_id, labels_csv(prices))
    assert r.json()["clipped_above"] == sum(v > 18_500 for v in prices.values())
    got = created(release(client, admin, dataset_id, "grid", mechanism="opt-unbiased", epsilon=1.0))
    assert got["num_examples"] == 400


@pytest.mark.parametrize("body", [
    {"label_kind": "integer", "epsilon_total": 1},  # neither bounds nor clip
    {"label_kind": "integer", "min": 0, "epsilon_total": 1},
    {"label_kind": "integer", "min": 0, "max": 9, "clip": {"low": 0, "high": 10}, "epsilon_total": 1},
    {"label_kind": "continuous", "clip": {"low": 0}, "epsilon_total": 1},
    {"label_kind": "continuous", "clip": {"low": 0, "high": 1, "quantile": 0.9}, "epsilon_total": 1},
    {"label_kind": "finite", "values": [1, 2], "clip": {"low": 1, "high": 2}, "epsilon_total": 1},
    {"label_kind": "classes", "num_classes": 3, "clip": {"low": 0, "high": 2}, "epsilon_total": 1},
])
def test_bad_clip_declarations_are_refused(client, admin, body):
    r = client.post("/v1/datasets", headers=admin, json={"name": "bad", **body})
    expect_error(r, 422, "invalid_request")
    assert client.get("/v1/datasets", headers=admin).json() == []


def test_clip_bounds_must_make_a_domain(client, admin):
    r = client.post("/v1/datasets", headers=admin, json={"name": "bad", "label_kind": "continuous",
                                                         "clip": {"low": 5, "high": 1}, "epsilon_total": 1})
    assert "low < high" in expect_error(r, 400, "invalid_domain")["message"]
    assert client.get("/v1/datasets", headers=admin).json() == []
