"""Central label DP (LabelDP-Pro at the labels party): refused unless enabled, charged its RDP curve at the
organization's δ before it trains (so trainings compose as the accountant says), returns only parameters, and the
audit recomputes its (ε, δ) from the recorded dp-accounting event."""

from __future__ import annotations

import dp_accounting
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant

from labels_party.http.audit import verify_audit
from labels_party.ledger import RDP_ORDERS
from shared import models
from shared.mechanisms import events
from tests.labels_party.api.helpers import admin_client, digits_datasets


@pytest.fixture()
def setup(tmp_path):
    return digits_datasets(tmp_path, epsilon_total=3.0)


def _request(ids, x, epsilon=2.0):
    return {"epsilon": epsilon, "denoiser": "noop", "steps": 120, "batch_size": 256, "learning_rate": 0.5,
            "hidden": [32], "example_ids": ids[:1400], "features": x[:1400].tolist()}


def test_central_training_returns_parameters_and_is_accounted(setup):
    ctx, client, datasets, ids, x, y = setup
    response = client.post(f"/v1/datasets/{datasets[True]}/central-trainings", json=_request(ids, x),
                           headers={"Idempotency-Key": "c1"})
    assert response.status_code == 201, response.text
    assert not response.json()["description"]["parameters"]  # the response stays small; the model is here:
    description = client.get(f"/v1/mechanisms/{response.json()['mechanism_hash']}").json()["description"]
    assert description["certified_epsilon"] <= 2.0 + 1e-3 and description["noise_multiplier"] > 0
    params = {"embeddings": [], "layers": [{"w": jnp.asarray(layer["w"]), "b": jnp.asarray(layer["b"])}
                                          for layer in description["parameters"]["layers"]]}
    logits = models.apply(params, jnp.asarray(x[1400:], jnp.float32), jnp.zeros((len(x) - 1400, 0), jnp.int32))
    assert np.mean(np.argmax(np.asarray(logits), axis=1) == y[1400:]) > 0.4  # learned (chance: 0.1)
    # charged its RDP curve at the account's δ (the dataset's 10⁻⁶, which calibrated the noise): 2.0 up to the
    # calibration's tolerance and the curve's rounding up
    budget = client.get(f"/v1/datasets/{datasets[True]}/budget").json()
    assert 2.0 - 1e-3 <= budget["epsilon_spent"] <= 2.0 + 1e-6
    record = client.get("/v1/audit", params={"dataset": datasets[True]}).json()["events"][0]["record"]
    event = events.from_dict(record["dp_event"])
    assert record["delta"] == 1e-6 and type(event) is dp_accounting.SelfComposedDpEvent and record["charge_units"] == 0
    accountant = RdpAccountant(orders=list(RDP_ORDERS))
    accountant.compose(event)
    assert accountant.get_epsilon(1e-6) <= budget["epsilon_spent"] <= accountant.get_epsilon(1e-6) + 1e-8
    assert verify_audit(ctx)["valid"]  # recomputes the curve from the recorded event
    # A second run composes with the first as the accountant composes them — not by adding ε (2 + 1.5 > 3)
    second = client.post(f"/v1/datasets/{datasets[True]}/central-trainings", json=_request(ids, x, 1.5),
                         headers={"Idempotency-Key": "c2"})
    assert second.status_code == 201, second.text
    accountant.compose(events.from_dict(client.get("/v1/audit", params={"dataset": datasets[True]}).json()
                                        ["events"][1]["record"]["dp_event"]))
    composed = accountant.get_epsilon(1e-6)
    assert composed < 3.0 < 2.0 + 1.5
    # the integer curves are rounded up (a unit per order and event), never down
    assert composed <= client.get(f"/v1/datasets/{datasets[True]}/budget").json()["epsilon_spent"] <= composed + 1e-8
    over = client.post(f"/v1/datasets/{datasets[True]}/central-trainings", json=_request(ids, x, 3.0),
                       headers={"Idempotency-Key": "c3"})
    assert over.status_code == 409 and over.json()["error"]["code"] == "budget_exceeded"
    assert verify_audit(ctx)["valid"]


def test_delta_is_budgeted(setup):
    """The attack of issue 26: tiny ε with a large δ was charged its ε alone. Now a δ above the organization's
    allocation is refused before anything runs, and one within it is charged its ε at the allocation's δ."""
    _, client, datasets, ids, x, _ = setup
    dataset = datasets[True]
    refused = client.post(f"/v1/datasets/{dataset}/central-trainings", headers={"Idempotency-Key": "d"},
                          json={**_request(ids, x, 0.001), "delta": 0.0099, "steps": 1})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_epsilon", refused.text
    assert client.get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 0.0
    assert client.get("/v1/audit", params={"dataset": dataset}).json()["events"] == []


def test_refused_unless_the_owner_enabled_it(setup):
    _, client, datasets, ids, x, _ = setup
    response = client.post(f"/v1/datasets/{datasets[False]}/central-trainings", json=_request(ids, x),
                           headers={"Idempotency-Key": "c"})
    assert response.status_code == 409 and response.json()["error"]["code"] == "central_training_disabled"
    assert client.get(f"/v1/datasets/{datasets[False]}/budget").json()["epsilon_spent"] == 0.0


def test_ragged_features_are_refused(setup):
    """Vectors of different lengths fit the schema (a list of lists) but not the request: 400 invalid_input."""
    _, client, datasets, ids, x, _ = setup
    bad = {**_request(ids, x), "features": [[0.0, 1.0], [0.0]] + x[2:1400].tolist()}
    response = client.post(f"/v1/datasets/{datasets[True]}/central-trainings", json=bad,
                           headers={"Idempotency-Key": "m"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_input"


def test_parameters_survive_the_trip_through_json():
    import json

    import jax

    spec = models.ModelSpec(num_numeric=3, vocab_sizes=(4, 2), embed_dim=2, hidden=(5,), output_dim=3)
    params = models.init_params(jax.random.PRNGKey(0), spec)
    params["layers"][-1]["w"] = params["layers"][-1]["w"] + 0.125  # not the zeros init: the trip must carry values
    back = models.params_from_lists(json.loads(json.dumps(models.params_to_lists(params))))
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(params)
    for before, after in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(back), strict=True):
        assert after.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(after), np.asarray(before, dtype=np.float32))
    numeric = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
    categorical = np.array([[0, 1], [3, 0], [2, 1], [1, 1], [0, 0], [3, 1]])
    np.testing.assert_array_equal(models.apply(back, numeric, categorical), models.apply(params, numeric, categorical))


def test_features_that_overflow_training_are_refused_before_anything_runs(setup):
    _, client, datasets, ids, x, _ = setup
    body = _request(ids, x)
    body["features"] = [[3.4e38] + row[1:] for row in body["features"][:1]] + body["features"][1:]
    refused = client.post(f"/v1/datasets/{datasets[True]}/central-trainings", json=body,
                          headers={"Idempotency-Key": "huge"})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_input"
    assert client.get(f"/v1/datasets/{datasets[True]}/budget").json()["epsilon_spent"] == 0.0


def test_the_review_attack_gets_the_same_answer_for_every_label(tmp_path):
    """Issue 26's review: a target with an extreme feature, one step at a negligible learning rate: whether its
    gradient overflowed (a 503) told its label. At the largest feature allowed, every label gives a 201 with
    finite parameters."""
    statuses = {}
    for label in (0, 1, 2):
        ctx, client = admin_client(tmp_path / str(label), "hospital")
        dataset = client.post("/v1/datasets", json={"name": "d", "label_kind": "classes", "num_classes": 3,
                                                    "epsilon_total": 100, "delta_total": 1e-6,
                                                    "allow_central_training": True}).json()["id"]
        client.put(f"/v1/datasets/{dataset}/labels", content=f"example_id,label\nx,{label}\no,0\n",
                   headers={"Content-Type": "text/csv"})
        outcomes = []
        for attempt in range(3):
            body = {"epsilon": 0.01, "steps": 1, "batch_size": 2, "learning_rate": 1e-30, "hidden": [1],
                    "denoiser": "noop", "example_ids": ["x", "o"], "features": [[1e6] + [0.0] * 9, [0.0] * 10]}
            response = client.post(f"/v1/datasets/{dataset}/central-trainings", json=body,
                                   headers={"Idempotency-Key": f"{attempt}"})
            document = client.get(f"/v1/mechanisms/{response.json()['mechanism_hash']}").json()["description"]
            weights = np.concatenate([np.ravel(layer["w"]) for layer in document["parameters"]["layers"]])
            outcomes.append((response.status_code, bool(np.all(np.isfinite(weights)))))
        statuses[label] = outcomes
    assert statuses == {label: [(201, True)] * 3 for label in (0, 1, 2)}


def test_a_new_delta_allocation_reprices_what_was_spent(setup):
    """The review of issue 26: after the owner lowered an organization's δ, its budget still showed the ε of its
    trainings at the old δ. Now the allocation reprices its classes: the figures are the accountant's at the new
    δ, and the dataset's sum follows."""
    from labels_party.http.auth import create_key
    from tests.labels_party.api.helpers import bearer

    ctx, client, datasets, ids, x, _ = setup
    dataset = datasets[True]
    with ctx.sessions() as session, session.begin():
        publisher = bearer(create_key(ctx.ledger, session, "publisher", "consumer"))
    assert client.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 2.5,
                                                               "delta": 5e-7}).status_code == 201
    trained = client.post(f"/v1/datasets/{dataset}/central-trainings", json=_request(ids, x, 1.0),
                          headers={**publisher, "Idempotency-Key": "t"})
    assert trained.status_code == 201, trained.text
    event = events.from_dict(client.get("/v1/audit", params={"dataset": dataset}).json()["events"][0]["record"]
                             ["dp_event"])
    accountant = RdpAccountant(orders=list(RDP_ORDERS))
    accountant.compose(event)
    before = client.get(f"/v1/datasets/{dataset}/budget", headers=publisher).json()["epsilon_spent"]
    assert accountant.get_epsilon(5e-7) <= before <= accountant.get_epsilon(5e-7) + 1e-8
    assert client.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 2.5,
                                                               "delta": 1e-8}).status_code == 201
    after = client.get(f"/v1/datasets/{dataset}/budget", headers=publisher).json()
    assert accountant.get_epsilon(1e-8) <= after["epsilon_spent"] <= accountant.get_epsilon(1e-8) + 1e-8
    assert after["epsilon_spent"] > before and after["delta_total"] == 1e-8
    owner = client.get(f"/v1/datasets/{dataset}/budget").json()
    assert owner["epsilon_spent"] == pytest.approx(sum(o["epsilon_spent"] for o in owner["organizations"]), abs=1e-9)
    # a δ so small that what was spent no longer fits the allocation is refused
    refused = client.post(f"/v1/datasets/{dataset}/grants", json={"org": "publisher", "epsilon": 2.5,
                                                                  "delta": 1e-300})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "allocation_exceeded"
    assert verify_audit(ctx)["valid"]


def test_the_unbounded_training_of_the_review_is_refused_before_the_charge(setup):
    """The hostile review: a consumer with a δ allocation asked for 300 steps of a [512, 512] MLP at batch 2,000 on
    8 features; it ran for 13 minutes, unstoppable, beyond the CPU quota. Now the run's size, steps × (padded batch
    + the denoiser's rows) × parameters, is decided from public inputs and refused before anything is charged."""
    from labels_party.http.auth import create_key
    from tests.labels_party.api.helpers import bearer

    ctx, client, datasets, ids, x, _ = setup
    dataset = datasets[True]
    with ctx.sessions() as session, session.begin():
        consumer = bearer(create_key(ctx.ledger, session, "consumer", "consumer"))
    assert client.post(f"/v1/datasets/{dataset}/grants", json={"org": "consumer", "epsilon": 2.5,
                                                               "delta": 5e-7}).status_code == 201
    review = {"epsilon": 1, "steps": 300, "batch_size": 2000, "hidden": [512, 512], "example_ids": ids,
              "features": x[:, :8].tolist()}
    refused = client.post(f"/v1/datasets/{dataset}/central-trainings", json=review,
                          headers={**consumer, "Idempotency-Key": "big"})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "training_too_large", refused.text
    # 1,797 examples: the batch is all of them, padded to ⌈1797 + 4·√1797 + 1⌉ = 1,968 rows, plus altconv's 64;
    # parameters 8·512 + 512 + 512·512 + 512 + 512·10 + 10 = 272,394; 300 steps
    assert f"{300 * (1968 + 64) * 272_394:,}" in refused.json()["error"]["message"]
    # one step alone may be too large too: its per-example gradients are held at once
    one_step = client.post(f"/v1/datasets/{dataset}/central-trainings", json={**review, "steps": 1},
                           headers={**consumer, "Idempotency-Key": "step"})
    assert one_step.status_code == 400 and one_step.json()["error"]["code"] == "training_too_large"
    assert f"one step of this training is {(1968 + 64) * 272_394:,}" in one_step.json()["error"]["message"]
    assert client.get(f"/v1/datasets/{dataset}/budget", headers=consumer).json()["epsilon_spent"] == 0.0
    assert client.get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 0.0
    assert client.get("/v1/audit", params={"dataset": dataset}).json()["events"] == []
    description = client.get("/openapi.json").json()["paths"]["/v1/datasets/{dataset_id}/central-trainings"]["post"][
        "description"]
    assert "training_too_large" in description and f"{ctx.settings.max_central_training_size:,}" in description


def test_the_training_size_limit_is_exact():
    """At the limit a training is allowed, one unit above it refused (whole run and one step)."""
    from types import SimpleNamespace

    from labels_party.core import labeldp_pro
    from labels_party.releases.kinds import check_training_size
    from labels_party.runtime.settings import LabelsSettings
    from shared import models
    from shared.errors import LabelDPError

    config = labeldp_pro.ProConfig(denoiser="selfconv", steps=7, batch_size=100, hidden=(16,))
    # 1,000 examples: batch 100 padded to 141 rows, plus selfconv's 100; (8 + 1)·16 + (16 + 1)·3 = 195 parameters
    step, run = (141 + 100) * 195, 7 * (141 + 100) * 195
    assert labeldp_pro.training_size(config, 1000, 195) == (step, run)
    num_params = models.num_params(labeldp_pro.model_spec(8, config.hidden, 3))
    assert num_params == 195
    for total, per_step, allowed in ((run, step, True), (run - 1, step, False), (run, step - 1, False)):
        ctx = SimpleNamespace(settings=LabelsSettings(max_central_training_size=total,
                                                      max_central_training_step=per_step))
        sizes = labeldp_pro.training_size(config, 1000, num_params)
        if allowed:
            check_training_size(ctx, *sizes, "less")
        else:
            with pytest.raises(LabelDPError) as refused:
                check_training_size(ctx, *sizes, "less")
            assert refused.value.code == "training_too_large"
