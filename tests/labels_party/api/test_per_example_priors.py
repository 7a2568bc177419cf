"""RRWithPrior with one prior per example: the vectorized sampler realizes exactly the RR-Top-k of each
example's prior, and the service releases it through a columnar body with per-example accounting."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy import stats

from labels_party.core.solvers.rr_with_prior import best_top_k, rr_with_prior, rr_with_prior_per_example
from tests.labels_party.api.helpers import admin_client


def test_vectorized_sampler_matches_each_examples_rr_top_k():
    rng = np.random.default_rng(4)
    distinct = rng.dirichlet(np.full(5, 0.4), size=4)  # four different priors, many examples each
    which = rng.integers(0, 4, size=200_000)
    labels = rng.integers(0, 5, size=which.size)
    result = rr_with_prior_per_example(distinct[which], labels, 1.5, np.random.default_rng(5))
    assert result.certified_epsilon <= 1.5
    for j, prior in enumerate(distinct):
        matrix = rr_with_prior(prior, 1.5).matrix
        assert np.all(result.k[which == j] == best_top_k(prior, 1.5 - 1.5e-9)[1])
        for label in range(5):
            chosen = (which == j) & (labels == label)
            observed = np.bincount(result.outputs[chosen], minlength=5)
            expected = matrix[label] * chosen.sum()
            support = expected > 0
            assert observed[~support].sum() == 0  # never a class outside the candidates
            if support.sum() > 1:
                assert stats.chisquare(observed[support], expected[support]).pvalue > 1e-4


def test_invalid_priors_are_refused():
    from shared.errors import LabelDPError

    for priors in (np.array([[0.5, -0.1]]), np.array([[0.0, 0.0]]), np.array([[np.nan, 1.0]])):
        with pytest.raises(LabelDPError):
            rr_with_prior_per_example(priors, np.array([0]), 1.0, np.random.default_rng(0))


def _parquet(ids, priors) -> bytes:
    columns = {"example_id": pa.array(ids)}
    columns.update({f"p_{k}": pa.array(priors[:, k]) for k in range(priors.shape[1])})
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue()


@pytest.fixture()
def service(tmp_path):
    _, client = admin_client(tmp_path)
    dataset = client.post("/v1/datasets", json={"name": "c", "label_kind": "classes", "num_classes": 3,
                                                "epsilon_total": 2.0}).json()["id"]
    labels = np.arange(300) % 3
    body = "example_id,label\n" + "\n".join(f"e{i},{v}" for i, v in enumerate(labels))
    client.put(f"/v1/datasets/{dataset}/labels", content=body, headers={"Content-Type": "text/csv"})
    return client, dataset, labels


def _post(client, dataset, ids, priors, epsilon=1.0, key="k1"):
    return client.post(f"/v1/datasets/{dataset}/prior-releases", params={"epsilon": epsilon},
                       content=_parquet(ids, priors),
                       headers={"Content-Type": "application/vnd.apache.parquet", "Idempotency-Key": key})


def test_prior_release_charges_only_its_examples_and_is_idempotent(service):
    client, dataset, labels = service
    ids = [f"e{i}" for i in range(100)]
    priors = np.tile([0.45, 0.45, 0.1], (100, 1))
    first = _post(client, dataset, ids, priors)
    assert first.status_code == 201, first.text
    release = first.json()
    assert release["certified_epsilon"] <= 1.0 and release["num_examples"] == 100
    # k* = 2: 0.9 e/(e+1) ≈ 0.658 beats k=1 (0.45) and k=3 (e/(e+2) ≈ 0.576)
    assert release["description"]["mean_k"] == 2.0
    document = client.get(f"/v1/mechanisms/{release['mechanism_hash']}").json()
    assert document["description"]["k_histogram"][1] == 100
    again = _post(client, dataset, ids, priors)
    assert again.status_code == 200 and again.json()["id"] == release["id"]
    assert _post(client, dataset, ids, priors * 0.5).status_code == 409  # same key, other body
    downloaded = client.get(f"/v1/releases/{release['id']}/labels", headers={"Accept": "application/json"},
                            params={"limit": 1000}).json()["items"]
    assert {row["label"] for row in downloaded} <= {0.0, 1.0}  # only the top-2 classes are ever released
    assert client.get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 1.0
    # the other 200 examples were not charged: a full release at 2.0 is refused, at 1.0 on them it fits
    other = [f"e{i}" for i in range(100, 300)]
    assert _post(client, dataset, other, np.tile([1 / 3] * 3, (200, 1)), 2.0, "k2").status_code == 201
    assert _post(client, dataset, ids, priors, 1.5, "k3").json()["error"]["code"] == "budget_exceeded"
    events = client.get("/v1/audit", params={"dataset": dataset}).json()["events"]
    assert [e["record"]["examples_covered"] for e in events] == [100, 200]


@pytest.mark.parametrize(("ids", "priors", "code"), [
    (["e1", "nobody"], np.ones((2, 3)), "unknown_example_ids"),
    (["e1"], np.array([[1.0, -1.0, 1.0]]), "invalid_prior"),
    (["e1"], np.ones((1, 2)), "malformed_file"),
])
def test_bad_prior_bodies_are_refused(service, ids, priors, code):
    client, dataset, _ = service
    response = _post(client, dataset, ids, priors)
    assert response.status_code == 400 and response.json()["error"]["code"] == code
    assert client.get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 0.0


def test_prior_release_needs_a_classes_dataset(tmp_path):
    _, client = admin_client(tmp_path)
    dataset = client.post("/v1/datasets", json={"name": "r", "label_kind": "integer", "min": 0, "max": 2,
                                                "epsilon_total": 2.0}).json()["id"]
    client.put(f"/v1/datasets/{dataset}/labels", content="example_id,label\ne1,1\n",
               headers={"Content-Type": "text/csv"})
    response = _post(client, dataset, ["e1"], np.ones((1, 3)))
    assert response.status_code == 400 and response.json()["error"]["code"] == "mechanism_domain_mismatch"
