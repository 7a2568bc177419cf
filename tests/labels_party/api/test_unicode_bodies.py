"""A JSON body may escape a lone surrogate ("\\ud800"), valid JSON but no Unicode string: every JSON route refuses
it with one 400 before it reads anything else (issue 40, item 11: it was a 500 on releases, evaluations, quantiles,
central trainings and the trainer's jobs, some after the charge). A surrogate pair is a character like any other."""

from __future__ import annotations

import pytest

from tests.labels_party.api.helpers import admin_client

LONE = '"\\ud800"'
BODIES = {  # ID: where the string goes
    "releases": '{"mechanism": "rr", "epsilon": 0.5, "example_ids": ["a", ID]}',
    "evaluations": '{"metric": "mse", "epsilon": 0.5, "example_ids": ["a", ID], "predictions": [1.0, 2.0]}',
    "quantiles": '{"quantiles": [0.5], "epsilon": 0.5, "example_ids": [ID]}',
    "central-trainings": '{"epsilon": 0.5, "example_ids": ["a", ID], "features": [[0.0], [1.0]]}',
}


@pytest.fixture()
def service(tmp_path):
    _ctx, client = admin_client(tmp_path)
    dataset = client.post("/v1/datasets", json={"name": "t", "label_kind": "integer", "min": 0, "max": 10,
                                                "epsilon_total": 1.0}).json()["id"]
    client.put(f"/v1/datasets/{dataset}/labels", content="example_id,label\na,1\nb,2",
               headers={"Content-Type": "text/csv"})
    return client, dataset


@pytest.mark.parametrize("route", list(BODIES))
def test_a_lone_surrogate_is_a_400_and_changes_nothing(service, route):
    client, dataset = service
    answer = client.post(f"/v1/datasets/{dataset}/{route}", content=BODIES[route].replace("ID", LONE),
                         headers={"Content-Type": "application/json", "Idempotency-Key": route})
    assert answer.status_code == 400, answer.text
    assert answer.json() == {"error": {"code": "invalid_input", "message": (
        "a string of the body is not valid Unicode (a lone surrogate): send UTF-8 text")}}
    assert client.get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 0.0


def test_a_surrogate_pair_is_an_ordinary_character(service):
    client, dataset = service
    pair = BODIES["releases"].replace("ID", '"\\ud83d\\ude00"')
    answer = client.post(f"/v1/datasets/{dataset}/releases", content=pair,
                         headers={"Content-Type": "application/json", "Idempotency-Key": "pair"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "unknown_example_ids"  # an id it lacks


def test_the_trainers_job_route_refuses_it_too(tmp_path):
    from tests.features_party.test_api import trainer_client, trainer_context

    ctx = trainer_context(tmp_path, "http://127.0.0.1:9", start=False)  # nothing is asked of it
    trainer = trainer_client(ctx, "publisher")
    body = ('{"features": "f", "dataset_id": "d", "api_key": "k", "release": {"mechanism": "rr", "epsilon": 1, '
            '"example_ids": [' + LONE + ']}}')
    answer = trainer.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_input", answer.text
    assert trainer.get("/v1/jobs").json() == []
