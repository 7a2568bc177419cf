"""Extreme ε at the service: outside the deployment's range (default [10⁻³, 50]) a 400 epsilon_out_of_range
before anything is computed, charged or written; inside it a release or a 4xx, never a 500; and a release that
fails at any point leaves no file behind."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from labels_party.http.api import create_app
from labels_party.http.auth import create_key
from labels_party.runtime.context import make_context
from labels_party.runtime.settings import LabelsSettings


@pytest.fixture()
def service(tmp_path):
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data")
    with ctx.sessions() as session, session.begin():
        key = create_key(ctx.ledger, session, "owner", "admin")
    client = TestClient(create_app(ctx), raise_server_exceptions=False)
    headers = {"Authorization": f"Bearer {key}"}
    dataset = client.post("/v1/datasets", headers=headers, json={
        "name": "d", "label_kind": "integer", "min": 0, "max": 9, "epsilon_total": 50}).json()["id"]
    csv = "example_id,label\n" + "".join(f"e{i},{i % 10}\n" for i in range(200))
    assert client.put(f"/v1/datasets/{dataset}/labels", content=csv,
                      headers={**headers, "Content-Type": "text/csv"}).status_code == 200
    return ctx, client, headers, dataset, tmp_path / "data" / "releases"


def _files(directory) -> list:
    return sorted(directory.glob("*")) if directory.exists() else []


def _spent(client, headers, dataset) -> float:
    return client.get(f"/v1/datasets/{dataset}/budget", headers=headers).json()["epsilon_spent"]


@pytest.mark.parametrize("epsilon", [5e-324, 1e-300, 1e-17, 1e-15, 5e-7, 0.000999999, 50.000001, 500, 1000, 1e4])
@pytest.mark.parametrize("mechanism", ["laplace", "staircase", "opt-unbiased", "rr-on-bins", "rr", "dbrr"])
def test_out_of_range_epsilon_is_a_400_and_leaves_nothing(service, mechanism, epsilon):
    _, client, headers, dataset, releases = service
    response = client.post(f"/v1/datasets/{dataset}/releases", headers={**headers, "Idempotency-Key": "x"},
                           json={"mechanism": mechanism, "epsilon": epsilon})
    assert response.status_code == 400 and response.json()["error"]["code"] == "epsilon_out_of_range"
    assert "[0.001, 50]" in response.json()["error"]["message"]
    assert _files(releases) == [] and _spent(client, headers, dataset) == 0.0


@pytest.mark.parametrize("epsilon", [1e-3, 0.003, 16.0, 30.0, 50.0])
@pytest.mark.parametrize("mechanism", ["laplace", "staircase", "opt-unbiased", "rr-on-bins", "rr", "dbrr"])
def test_every_epsilon_in_range_is_released_or_refused_with_a_4xx(service, mechanism, epsilon):
    _, client, headers, dataset, releases = service
    response = client.post(f"/v1/datasets/{dataset}/releases", headers={**headers, "Idempotency-Key": "y"},
                           json={"mechanism": mechanism, "epsilon": epsilon})
    assert response.status_code in (201, 400), response.text
    if response.status_code == 201:
        body = response.json()
        assert 0 < body["certified_epsilon"] <= epsilon
        assert len(_files(releases)) == 1
    else:  # e.g. opt-unbiased below its solver's floor: named, nothing charged, nothing written
        assert response.json()["error"]["code"] == "epsilon_out_of_range"
        assert _files(releases) == [] and _spent(client, headers, dataset) == 0.0


def test_query_epsilons_are_range_checked(service):
    _, client, headers, dataset, releases = service
    for path in (f"/v1/datasets/{dataset}/prior-releases?epsilon=1e-300",
                 f"/v1/datasets/{dataset}/group-releases?mechanism=opt-unbiased&epsilon=1&prior_epsilon=1e4"):
        response = client.post(path, content=b"example_id,group\ne1,a\n",
                               headers={**headers, "Idempotency-Key": "q", "Content-Type": "text/csv"})
        assert response.status_code == 400 and response.json()["error"]["code"] == "epsilon_out_of_range"
    assert _files(releases) == []


def test_openapi_states_the_deployment_range(tmp_path):
    settings = LabelsSettings(epsilon_min=0.01, epsilon_max=8.0)
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data", settings=settings)
    spec = TestClient(create_app(ctx)).get("/openapi.json").json()
    for model in ("ReleaseRequest", "EvaluationRequest", "CentralTrainingRequest", "QuantilesRequest"):
        epsilon = spec["components"]["schemas"][model]["properties"]["epsilon"]
        assert epsilon["minimum"] == 0.01 and epsilon["maximum"] == 8.0
    prior = spec["components"]["schemas"]["ReleaseRequest"]["properties"]["prior_epsilon"]["anyOf"][0]
    assert prior["minimum"] == 0.01 and prior["maximum"] == 8.0
    parameters = spec["paths"]["/v1/datasets/{dataset_id}/group-releases"]["post"]["parameters"]
    assert {p["name"]: p["schema"]["maximum"] for p in parameters if "epsilon" in p["name"]} == \
        {"epsilon": 8.0, "prior_epsilon": 8.0}
    with pytest.raises(ValueError):
        LabelsSettings(epsilon_min=1e-7)  # below what the mechanisms certify


def test_a_release_that_fails_while_committing_leaves_no_file(service, monkeypatch):
    ctx, client, headers, dataset, releases = service

    def broken_charge(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(ctx.ledger, "charge", broken_charge)
    response = client.post(f"/v1/datasets/{dataset}/releases", headers={**headers, "Idempotency-Key": "z"},
                           json={"mechanism": "rr", "epsilon": 1.0})
    assert response.status_code == 500 and "Traceback" not in response.text
    assert _files(releases) == [] and _spent(client, headers, dataset) == 0.0


@pytest.mark.parametrize("epsilon", [5e-324, 1e-300, 1e-17, 0.0, -1.0, 50.000001, 1e4])
def test_every_endpoint_refuses_an_epsilon_outside_the_range(service, epsilon):
    _, client, headers, dataset, releases = service
    requests = [
        ("/evaluations", {"metric": "mse", "epsilon": epsilon, "clip": 10.0, "example_ids": ["e1"],
                          "predictions": [1.0]}),
        ("/central-trainings", {"epsilon": epsilon, "example_ids": ["e1", "e2"], "features": [[0.0], [1.0]]}),
        ("/quantiles", {"quantiles": [0.5], "epsilon": epsilon}),
        ("/releases", {"mechanism": "rr-on-bins", "epsilon": 1.0, "prior_epsilon": epsilon}),
    ]
    for path, body in requests:
        response = client.post(f"/v1/datasets/{dataset}{path}", json=body, headers={**headers, "Idempotency-Key": path})
        assert response.status_code == 400 and response.json()["error"]["code"] == "epsilon_out_of_range", path
    for path in (f"/prior-releases?epsilon={epsilon!r}", f"/group-releases?mechanism=rr-on-bins&epsilon={epsilon!r}"
                                                         "&prior_epsilon=0.5"):
        response = client.post(f"/v1/datasets/{dataset}{path}", content=b"example_id,p_0\ne1,1\n",
                                headers={**headers, "Idempotency-Key": "q", "Content-Type": "text/csv"})
        assert response.status_code == 400 and response.json()["error"]["code"] == "epsilon_out_of_range", path
    assert _files(releases) == [] and _spent(client, headers, dataset) == 0.0
