"""The features party's unbiased test-MSE estimate, built only from a release's mechanism document: over seeded
repetitions of the release's noise its mean is the true MSE and its 95 % interval covers it about 95 % of the time;
biased mechanisms are refused, and a variance correction that cannot be exact states its bias bound."""

from __future__ import annotations

import json

import numpy as np
import pytest

from labels_party.core import pipeline
from labels_party.core.registry import MechanismOptions
from shared.domains import ContinuousInterval, FiniteLabels, integer_range
from shared.errors import LabelDPError
from shared.estimates import unbiased_mse_estimate, unbiased_mse_estimate_from_document
from shared.mechanisms.documents import sampler_from_description

DOMAIN = integer_range(0, 10)
REPETITIONS = 200


@pytest.fixture(scope="module")
def held_out():
    """A fixed held-out set: labels, a model's predictions (errors of sd 1.5, slightly biased) and their MSE."""
    rng = np.random.default_rng(11)
    labels = rng.binomial(10, 0.35, size=2000).astype(float)
    predictions = labels + 0.3 + rng.normal(0, 1.5, size=labels.size)
    return labels, predictions, float(np.mean((predictions - labels) ** 2))


def release_document(mechanism: str, labels, epsilon: float = 2.0, domain=DOMAIN, **options) -> dict:
    """The mechanism document a release of ``labels`` stores (labels_party.releases.lifecycle.finish), as JSON."""
    prepared = pipeline.prepare(domain, mechanism, epsilon, len(labels), options=MechanismOptions(**options))
    counts = np.bincount(labels.astype(int), minlength=domain.support().size)
    planned = pipeline.plan(prepared, counts, np.random.default_rng(5))
    document = {"description": planned.describe(),
                "noisy_prior": planned.prior.describe() if planned.prior else None}
    return json.loads(json.dumps(document))


@pytest.mark.parametrize("mechanism", ["opt-unbiased", "dbrr", "laplace"])
def test_estimate_is_unbiased_and_its_interval_covers(held_out, mechanism):
    labels, predictions, truth = held_out
    document = release_document(mechanism, labels)
    sampler = sampler_from_description(document["description"])
    estimates, covered = [], 0
    for seed in range(REPETITIONS):
        noisy = sampler.sample(labels, np.random.default_rng(1000 + seed))
        result = unbiased_mse_estimate_from_document(predictions, noisy, document, domain=DOMAIN)
        estimates.append(result.estimate)
        low, high = result.confidence_interval
        covered += low <= truth <= high
    estimates = np.array(estimates)
    assert abs(estimates.mean() - truth) < 3 * estimates.std(ddof=1) / np.sqrt(REPETITIONS)
    assert 0.90 * REPETITIONS <= covered <= 0.99 * REPETITIONS
    assert result.bias_bound == result.rounding_bound == 0.0  # integer labels on an integer lattice: no rounding
    low, high = result.confidence_interval  # both bounds 0: the plain normal interval
    assert (result.estimate - low, high - result.estimate) == pytest.approx((1.959964 * result.standard_error,) * 2)
    # the interval's width is the spread of the estimates it describes (its standard error is not a loose bound)
    assert result.standard_error == pytest.approx(estimates.std(ddof=1), rel=0.25)
    naive = np.mean((predictions - noisy) ** 2)
    assert naive > truth + 10 * result.standard_error  # what the correction removes: the noise's variance


def test_same_estimate_from_the_mechanism_and_from_its_json_document(held_out):
    labels, predictions, _ = held_out
    prepared = pipeline.prepare(DOMAIN, "opt-unbiased", 2.0, labels.size)
    planned = pipeline.plan(prepared, np.bincount(labels.astype(int), minlength=11), np.random.default_rng(5))
    noisy = planned.sampler.sample(labels, np.random.default_rng(6))
    direct = unbiased_mse_estimate(predictions, noisy, planned.mechanism, level=0.9)
    document = json.loads(json.dumps({"description": planned.describe(), "noisy_prior": planned.prior.describe()}))
    assert unbiased_mse_estimate_from_document(predictions, noisy, document, level=0.9) == direct
    assert direct.level == 0.9 and direct.num_examples == labels.size and direct.mechanism == "opt-unbiased"
    low, high = direct.confidence_interval
    assert (high - low) / 2 == pytest.approx(1.6448536 * direct.standard_error)


@pytest.mark.parametrize("mechanism, options", [("rr-on-bins", {}), ("laplace", {"clip": True})])
def test_a_biased_mechanism_is_refused(held_out, mechanism, options):
    labels, predictions, _ = held_out
    document = release_document(mechanism, labels, **options)
    noisy = sampler_from_description(document["description"]).sample(labels, np.random.default_rng(1))
    with pytest.raises(LabelDPError, match="biased") as refused:
        unbiased_mse_estimate_from_document(predictions, noisy, document)
    assert refused.value.code == "mechanism_biased"


def test_a_correction_that_cannot_be_exact_states_its_bias_bound(held_out):
    """The mesh solver's few outputs leave no function of ŷ whose mean is Var(ŷ | y) for every label: the estimate
    states how far off its mean can be, and is within that (and its noise) of the truth."""
    labels, predictions, truth = held_out
    document = release_document("opt-unbiased", labels, epsilon=1.0, mesh=12)
    sampler = sampler_from_description(document["description"])
    assert sampler.max_abs_bias < 1e-9 and sampler.output_values.size < 11
    results = [unbiased_mse_estimate_from_document(
        predictions, sampler.sample(labels, np.random.default_rng(seed)), document) for seed in range(REPETITIONS)]
    bound = results[0].bias_bound
    assert 0.01 < bound < 0.5 * truth
    for result in results[:3]:  # the interval owns up to the bias: widened by the bound on both sides
        half = 1.959964 * result.standard_error
        assert result.confidence_interval == pytest.approx((result.estimate - half - bound,
                                                            result.estimate + half + bound))
    estimates = np.array([r.estimate for r in results])
    assert abs(estimates.mean() - truth) < bound + 3 * estimates.std(ddof=1) / np.sqrt(REPETITIONS)


def test_labels_that_the_mechanism_cannot_output_are_refused(held_out):
    labels, predictions, _ = held_out
    document = release_document("dbrr", labels)
    noisy = sampler_from_description(document["description"]).sample(labels, np.random.default_rng(1))
    noisy[3] = 4.25  # not one of dbRR's outputs: labels of some other release
    with pytest.raises(LabelDPError, match="1 privatized label") as refused:
        unbiased_mse_estimate_from_document(predictions, noisy, document)
    assert refused.value.code == "invalid_input"
    with pytest.raises(LabelDPError, match="predictions for"):
        unbiased_mse_estimate_from_document(predictions[:-1], noisy, document)


def test_continuous_labels_state_the_rounding_bound():
    """On a continuous domain the mechanism acts on the grid; the estimate states what rounding may add."""
    domain = ContinuousInterval(0.0, 100.0, grid_size=21)  # spacing 5: at most 6.25 added
    rng = np.random.default_rng(2)
    labels = rng.uniform(0, 100, size=500)
    predictions = labels + rng.normal(0, 10, size=labels.size)
    released = pipeline.privatize_labels(domain, labels, "opt-unbiased", 4.0, rng)
    document = json.loads(json.dumps({"description": released.describe(), "noisy_prior": released.prior.describe()}))
    result = unbiased_mse_estimate_from_document(predictions, released.noisy_labels, document)
    assert result.rounding_bound == pytest.approx(6.25)
    assert unbiased_mse_estimate(predictions, released.noisy_labels, released.mechanism) == result
    # the estimate may overstate the MSE by the bound: the interval reaches that much lower, no higher
    half = 1.959964 * result.standard_error
    assert result.confidence_interval == pytest.approx((result.estimate - half - 6.25, result.estimate + half))
    assert result.bias_bound == 0.0


@pytest.mark.parametrize(("domain", "bound"), [
    (DOMAIN, 0.0),  # integers on the lattice of step 1: nothing is rounded
    ({"kind": "integer", "min": 0, "max": 10}, 0.0),  # a dataset's domain object, as the client passes it
    ({"kind": "finite", "values": [0.0, 2.0, 5.0, 10.0]}, 0.0),  # each on the release's lattice (step 1)
    ({"kind": "finite", "values": [0.0, 2.5, 10.0]}, 0.25),  # 2.5 is not: it would be rounded to 2 or 3
    (None, 0.25),  # not given: the labels may lie anywhere between lattice points
])
def test_additive_noise_rounds_nothing_when_the_domain_lies_on_its_lattice(held_out, domain, bound):
    labels, predictions, _ = held_out
    document = release_document("laplace", labels)
    noisy = sampler_from_description(document["description"]).sample(labels, np.random.default_rng(3))
    result = unbiased_mse_estimate_from_document(predictions, noisy, document, domain=domain)
    assert result.rounding_bound == bound


def test_additive_noise_on_labels_off_its_lattice_states_the_rounding_bound():
    """Finite labels that are not evenly spaced, or continuous ones, are rounded onto the lattice."""
    uneven = FiniteLabels(np.array([0.0, 1.0, 2.5]))  # its lattice: 3 steps of 5/6
    rng = np.random.default_rng(8)
    labels = rng.choice(uneven.values, size=400)
    document = release_document("laplace", labels, domain=uneven)
    step = document["description"]["lattice"]["step"]
    assert step == pytest.approx(2.5 / 3)
    noisy = sampler_from_description(document["description"]).sample(labels, rng)
    result = unbiased_mse_estimate_from_document(labels + 1.0, noisy, document, domain=uneven)
    assert result.rounding_bound == pytest.approx(step**2 / 4)
    continuous = ContinuousInterval(0.0, 10.0, grid_size=11)
    assert unbiased_mse_estimate_from_document(labels + 1.0, noisy, document,
                                               domain=continuous).rounding_bound == pytest.approx(step**2 / 4)
