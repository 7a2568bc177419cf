"""Private evaluation: the labels party's Laplace-noised test loss and the features party's unbiased estimate
from privatized labels both agree with the truth within their confidence intervals."""

from __future__ import annotations

import numpy as np
import pytest

from labels_party.core.evaluation import evaluate
from labels_party.core.solvers.opt_unbiased_mesh import solve_optimal_unbiased
from labels_party.http.audit import verify_audit
from shared.domains import integer_range, lattice_of
from shared.errors import LabelDPError
from shared.estimates import unbiased_mse_estimate
from shared.mechanisms.additive import laplace
from tests.labels_party.api.helpers import admin_client


def test_noisy_loss_is_unbiased_with_the_stated_scale_and_coverage():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 11, size=500).astype(float)
    predictions = labels + rng.normal(0, 2, size=500)
    truth = np.mean(np.minimum((predictions - labels) ** 2, 50.0))
    draws = [evaluate("mse", predictions, labels, 0.5, 50.0, np.random.default_rng(s)) for s in range(4000)]
    values = np.array([d.value for d in draws])
    scale = draws[0].noise_scale
    assert scale == pytest.approx(50.0 / (500 * 0.5))
    assert abs(values.mean() - truth) < 4 * np.sqrt(2) * scale / np.sqrt(values.size)
    assert values.var() == pytest.approx(2 * scale**2, rel=0.08)
    covered = np.mean([low <= truth <= high for low, high in (d.confidence_interval() for d in draws)])
    assert 0.93 < covered < 0.97


def test_accuracy_and_poisson_metrics():
    labels = np.array([0, 1, 2, 1, 0] * 200, dtype=float)
    predictions = labels.copy()
    predictions[:100] = 3  # 10 % wrong
    result = evaluate("accuracy", predictions, labels, 5.0, 1.0, np.random.default_rng(1))
    assert result.value == pytest.approx(0.9, abs=6 * result.noise_scale)
    rates = np.full(1000, 1.0)
    poisson = evaluate("poisson", rates, labels, 5.0, 10.0, np.random.default_rng(2))
    assert poisson.value == pytest.approx(np.mean(rates - labels * np.log(rates)), abs=6 * poisson.noise_scale)


@pytest.mark.parametrize("mechanism", ["opt-unbiased", "laplace"])
def test_features_party_unbiased_mse_estimate_from_private_labels(mechanism):
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 11, size=200_000).astype(float)
    predictions = labels + rng.normal(0, 1.5, size=labels.size)
    truth = np.mean((predictions - labels) ** 2)
    prior = np.bincount(labels.astype(int), minlength=11)
    randomizer = (solve_optimal_unbiased(np.arange(11.0), prior, 2.0, mesh=22) if mechanism == "opt-unbiased"
                  else laplace(lattice_of(integer_range(0, 10)), 2.0, input_values=np.arange(11.0)))
    noisy = randomizer.sample(labels, np.random.default_rng(4))
    result = unbiased_mse_estimate(predictions, noisy, randomizer)
    assert abs(result.estimate - truth) < 4 * result.standard_error
    assert np.mean((predictions - noisy) ** 2) > truth + 20 * result.standard_error  # the naive estimate is far off


@pytest.fixture()
def service(tmp_path):
    ctx, client = admin_client(tmp_path)
    dataset = client.post("/v1/datasets", json={"name": "t", "label_kind": "integer", "min": 0, "max": 10,
                                                "epsilon_total": 1.0}).json()["id"]
    labels = np.arange(1000) % 11
    client.put(f"/v1/datasets/{dataset}/labels", content="example_id,label\n" + "\n".join(
        f"t{i},{v}" for i, v in enumerate(labels)), headers={"Content-Type": "text/csv"})
    return ctx, client, dataset, labels


def test_evaluation_endpoint_charges_the_scored_examples(service):
    ctx, client, dataset, labels = service
    ids = [f"t{i}" for i in range(500)]
    body = {"metric": "mse", "epsilon": 0.5, "clip": 100.0, "example_ids": ids,
            "predictions": (labels[:500] + 1.0).tolist()}
    response = client.post(f"/v1/datasets/{dataset}/evaluations", json=body, headers={"Idempotency-Key": "e"})
    assert response.status_code == 201
    description = response.json()["description"]
    assert description["noise_scale"] == pytest.approx(100.0 / (500 * 0.5))
    assert description["value"] == pytest.approx(1.0, abs=8 * description["noise_scale"])
    retry = client.post(f"/v1/datasets/{dataset}/evaluations", json=body, headers={"Idempotency-Key": "e"})
    assert retry.status_code == 200 and retry.json()["description"]["value"] == description["value"]
    assert client.get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 0.5
    # the other 500 examples are untouched: a full-budget evaluation on them still fits
    other = {**body, "epsilon": 1.0, "example_ids": [f"t{i}" for i in range(500, 1000)]}
    assert client.post(f"/v1/datasets/{dataset}/evaluations", json=other,
                       headers={"Idempotency-Key": "f"}).status_code == 201
    assert verify_audit(ctx)["valid"]


@pytest.mark.parametrize(("change", "status", "code"), [
    ({"predictions": [1.0]}, 400, "invalid_input"),  # one prediction per example id
    ({"example_ids": ["t1", "ghost"], "predictions": [1.0, 2.0]}, 400, "unknown_example_ids"),
    ({"epsilon": 0}, 400, "epsilon_out_of_range"),
    ({"metric": "auc"}, 422, "invalid_request"),
    ({"clip": -1.0}, 422, "invalid_request"),
    ({"epsilon": 2.0}, 409, "budget_exceeded"),
])
def test_bad_evaluations_are_refused_and_charge_nothing(service, change, status, code):
    _, client, dataset, _ = service
    body = {"metric": "mse", "epsilon": 0.5, "clip": 10.0, "example_ids": ["t1", "t2"],
            "predictions": [1.0, 2.0], **change}
    response = client.post(f"/v1/datasets/{dataset}/evaluations", json=body, headers={"Idempotency-Key": "x"})
    assert response.status_code == status and response.json()["error"]["code"] == code
    assert client.get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 0.0


def test_released_mean_is_an_integer_sum_plus_exact_discrete_laplace_noise():
    """The answer is low + W (S + Z) / (levels · n): S the integer sum of rounded clipped losses (0/1 errors here,
    one level), Z discrete Laplace calibrated to that sensitivity; Z's empirical distribution is its exact pmf."""
    from scipy import stats

    labels = np.arange(200) % 11.0
    predictions = labels.copy()
    predictions[:37] += 1  # 37 errors
    rng = np.random.default_rng(12)
    noise = []
    for _ in range(3000):
        result = evaluate("accuracy", predictions, labels, 1.0, 1.0, rng)
        assert result.levels == 1 and 1.0 * (1 - 2**-30) < result.certified_epsilon <= 1.0
        assert result.value == pytest.approx(1.0 - result.noisy_sum / 200, abs=1e-15)
        noise.append(result.noisy_sum - 37)
    noise = np.array(noise)
    support = np.arange(-6, 7)
    tail = result.noise.upper_tail(7)
    observed = np.array([np.sum(noise < -6)] + [np.sum(noise == z) for z in support] + [np.sum(noise > 6)])
    expected = 3000 * np.concatenate([[tail], result.noise.pmf(support), [tail]])
    assert stats.chisquare(observed, expected * 3000 / expected.sum()).pvalue > 1e-3


def test_absurd_labels_and_clips_cannot_break_the_sensitivity():
    """A label is at most one loss level range away from any other, whatever it is: an overflowing loss is mapped
    into the clip range, never refused and never left outside it; a clip too large to keep the range finite is
    refused up front (it does not depend on the labels)."""
    rng = np.random.default_rng(0)
    sums = [evaluate("poisson", [1e-12], [label], 50.0, 1e15, rng).noisy_sum for label in (0.0, 1e307, 1e308)]
    assert max(sums) - min(sums) <= (1 << 20) + 100_000  # one label's levels plus noise at ε = 50
    with pytest.raises(LabelDPError) as err:
        evaluate("poisson", [1.0], [1.0], 1.0, 1e308, rng)
    assert err.value.code == "invalid_request"


def test_mean_metric_is_the_labels_mean_with_noise_scaled_to_the_declared_range():
    """The ``mean`` metric releases the labels' mean on the declared range [L, U]: unbiased up to the rounding to
    2^20 levels, noise scale (U − L)/(n ε), and the 95 % interval covers the true mean at its level."""
    from shared.domains import integer_range

    domain = integer_range(0, 99)
    labels = np.random.default_rng(5).integers(0, 100, size=2000).astype(float)
    draws = [evaluate("mean", None, labels, 0.25, 1.0, np.random.default_rng(s), domain=domain) for s in range(3000)]
    values = np.array([d.value for d in draws])
    scale = draws[0].noise_scale
    assert scale == pytest.approx(99 / (2000 * 0.25), rel=1e-6)
    assert abs(values.mean() - labels.mean()) < 4 * np.sqrt(2) * scale / np.sqrt(values.size)
    assert values.var() == pytest.approx(2 * scale**2, rel=0.08)
    covered = np.mean([low <= labels.mean() <= high for low, high in (d.confidence_interval() for d in draws)])
    assert 0.93 < covered < 0.97


def test_mean_metric_is_refused_for_class_labels_before_anything_is_read():
    from shared.domains import Classes

    with pytest.raises(LabelDPError) as caught:
        evaluate("mean", None, np.zeros(3), 1.0, 1.0, np.random.default_rng(0), domain=Classes(3))
    assert caught.value.code == "mechanism_domain_mismatch"


@pytest.mark.parametrize(("body", "status", "code"), [
    ({"metric": "mean", "epsilon": 0.5, "example_ids": ["t1"], "predictions": [1.0]}, 400, "invalid_input"),
    ({"metric": "mse", "epsilon": 0.5, "example_ids": ["t1"]}, 400, "invalid_input"),
])
def test_mean_takes_no_predictions_and_the_others_need_them(service, body, status, code):
    _, client, dataset, _ = service
    response = client.post(f"/v1/datasets/{dataset}/evaluations", json=body, headers={"Idempotency-Key": "m"})
    assert response.status_code == status and response.json()["error"]["code"] == code
    assert client.get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 0.0


def test_mean_endpoint_charges_its_examples_and_states_the_range(service):
    ctx, client, dataset, labels = service
    body = {"metric": "mean", "epsilon": 0.5, "example_ids": [f"t{i}" for i in range(1000)]}
    response = client.post(f"/v1/datasets/{dataset}/evaluations", json=body, headers={"Idempotency-Key": "mean"})
    assert response.status_code == 201
    description = response.json()["description"]
    assert (description["range_low"], description["range_high"]) == (0.0, 10.0) and description["metric"] == "mean"
    assert description["noise_scale"] == pytest.approx(10.0 / (1000 * 0.5))
    assert description["value"] == pytest.approx(labels.mean(), abs=8 * description["noise_scale"])
    assert client.get(f"/v1/datasets/{dataset}/budget").json()["epsilon_spent"] == 0.5
    assert verify_audit(ctx)["valid"]
