"""The empirical privacy auditor (labels_party/core/privacy_audit.py, `labeldp randomizer audit`): its 95 % lower bound
never exceeds a correct mechanism's certified ε, comes close to it (it has power), and exposes a mechanism whose
samples are less private than it claims."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from labels_party.core.privacy_audit import audit, candidate_labels
from labels_party.core.registry import MechanismOptions, build_mechanism
from shared.domains import Classes, ContinuousInterval, FiniteLabels, integer_range
from shared.mechanisms.randomized_response import randomized_response

CASES = [
    ("opt-unbiased", integer_range(0, 5), MechanismOptions(mesh=12)),
    ("opt-unbiased", integer_range(0, 5), MechanismOptions(solver="continuous")),
    ("rr-on-bins", integer_range(0, 5), MechanismOptions()),
    ("dbrr", integer_range(0, 5), MechanismOptions()),
    ("rr", integer_range(0, 5), MechanismOptions()),
    ("laplace", integer_range(0, 5), MechanismOptions()),
    ("laplace", integer_range(0, 5), MechanismOptions(clip=True)),
    ("staircase", FiniteLabels(np.array([0.0, 0.5, 1.0, 2.0])), MechanismOptions()),
    ("laplace", ContinuousInterval(0.0, 5.0, 6), MechanismOptions()),
    ("rr-with-prior", Classes(5), MechanismOptions()),
    ("subset", Classes(4), MechanismOptions()),
]


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
@pytest.mark.parametrize(("name", "domain", "options"), CASES,
                         ids=[f"{n}-{type(d).__name__}-{'clip' if o.clip else o.mesh or o.solver}"
                              for n, d, o in CASES])
def test_lower_bound_never_exceeds_the_certified_epsilon(name, domain, options, epsilon):
    size = domain.size if hasattr(domain, "size") else domain.grid_size
    prior = np.linspace(1, 2, size) if name in ("opt-unbiased", "rr-on-bins", "rr-with-prior") else None
    mechanism = build_mechanism(name, domain, epsilon, prior, options)
    labels = np.arange(domain.size, dtype=float) if isinstance(domain, Classes) else \
        domain.grid.values if isinstance(domain, ContinuousInterval) else domain.values
    result = audit(mechanism, labels, 60_000, np.random.default_rng(7))
    assert result.certified_epsilon == mechanism.certified_epsilon
    assert 0.0 <= result.empirical_epsilon_lower_bound <= result.certified_epsilon
    assert result.worst_pair[0] != result.worst_pair[1]


def test_randomized_response_bound_is_tight_with_a_million_samples():
    mechanism = randomized_response(np.arange(5.0), 1.0)
    result = audit(mechanism, np.arange(5.0), 1_000_000, np.random.default_rng(8))
    assert 0.8 <= result.empirical_epsilon_lower_bound <= mechanism.certified_epsilon
    assert result.samples == 1_000_000


@dataclass(frozen=True)
class Overclaiming:
    """Samples randomized response at ε = 2 but claims ε = 0.5: what a broken sampler looks like from outside."""

    name = "overclaiming-rr"
    certified_epsilon = 0.5

    def sample(self, labels, rng):
        return randomized_response(np.arange(5.0), 2.0).sample(labels, rng)


def test_a_mechanism_less_private_than_it_claims_is_exposed():
    result = audit(Overclaiming(), np.arange(5.0), 200_000, np.random.default_rng(9))
    assert result.empirical_epsilon_lower_bound > 1.5 > result.certified_epsilon


def test_candidates_are_every_label_up_to_64_then_extremes_and_neighbours():
    assert candidate_labels(np.arange(64.0)).size == 64
    assert candidate_labels(np.arange(1000.0)).tolist() == [0.0, 1.0, 499.0, 500.0, 998.0, 999.0]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "labeldp", "randomizer", "audit", *args],
                          capture_output=True, text=True, timeout=600)


def test_cli_reports_json_fields():
    done = _cli("--mechanism", "rr", "--epsilon", "1", "--labels", "0:4", "--samples", "1000000", "--seed", "3",
                "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {"mechanism", "certified_epsilon", "empirical_epsilon_lower_bound", "samples", "worst_pair"} <= set(report)
    assert report["samples"] == 1_000_000
    assert 0.8 <= report["empirical_epsilon_lower_bound"] <= report["certified_epsilon"] <= 1.0


@pytest.mark.parametrize("args", [
    ("--mechanism", "rr", "--epsilon", "1", "--labels", "0:4", "--samples", "10"),
    ("--mechanism", "rr", "--epsilon", "1e-300", "--labels", "0:4"),
    ("--mechanism", "subset", "--epsilon", "1", "--labels", "1:4"),
])
def test_cli_refuses_bad_input_with_one_line(args):
    done = _cli(*args)
    assert done.returncode != 0 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
