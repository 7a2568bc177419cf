"""The two-party demo runs end to end (quick mode: a 3000-example sample, one ε, few epochs for the regression
round; the classification round on digits at ε = 1 and 4). The demo runs once per module; each test reads what
it wrote."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from labeldp import demo_classification
from labeldp.demo import LEARNERS, MECHANISMS, load_hours_worked, run_demo

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    return out, run_demo(out, [1.0], quick=True)


@pytest.mark.slow
def test_quick_demo_writes_results_plot_and_a_complete_audit(quick_demo):
    out, rows = quick_demo
    saved = json.loads((out / "results.json").read_text())
    assert saved == rows
    # each mechanism: an MLP row, then the trees' row; then the auto job's; then each learner's non-private reference
    assert [(r["mechanism"], r["model"]) for r in rows] == [
        (m, model) for m, _ in MECHANISMS for model in LEARNERS] + [("auto", "auto")] + [
        ("non-private", model) for model in LEARNERS]
    private, auto, non_private = rows[:-3], rows[-3], rows[-2:]
    # auto chose among its candidates on its own labels, is certified within ε, and is no worse than the mean
    assert auto["epsilon"] == 1.0 and 0.99 < auto["certified_epsilon"] <= 1.0 and auto["chosen"]
    assert auto["test_mse"] <= 1.05 * non_private[0]["mean_predictor_test_mse"]
    assert auto["estimated_difference"]["estimate"] == pytest.approx(
        auto["estimated_mse"] - auto["estimated_constant_mse"], rel=1e-6, abs=1e-6)
    for row in private:
        assert row["epsilon"] == 1.0 and 0.99 < row["certified_epsilon"] <= 1.0
        assert np.isfinite(row["test_mse"]) and row["noisy_label_mse"] > 0
    hours = load_hours_worked()["hours"]
    for reference in non_private:
        assert reference["epsilon"] is None and reference["certified_epsilon"] is None
        assert reference["test_mse"] < 0.9 * hours.var()  # the features carry signal, for both learners
        assert reference["test_mse"] < reference["mean_predictor_test_mse"]
    assert (out / "test_loss_vs_epsilon.png").read_bytes()[:8] == PNG
    report = (out / "results.md").read_text()
    # the references (the demo holds the true labels) and the max |bias| of each release's mechanism
    assert (f"Mean predictor (predicting the training mean), test MSE: "
            f"{non_private[0]['mean_predictor_test_mse']:.2f}") in report
    for reference in non_private:
        assert (f"Non-private reference (a model trained on the true labels), {reference['model']} test MSE: "
                f"{reference['test_mse']:.2f}") in report
    # the trees trained on the MLP job's release, certified alike; each learner has its own row in the table
    for mlp, trees in zip(private[::2], private[1::2], strict=True):
        assert (mlp["model"], trees["model"]) == ("mlp", "gbdt")
        assert trees["release_id"] == mlp["release_id"] and trees["certified_epsilon"] == mlp["certified_epsilon"]
        assert (trees["noisy_label_mse"], trees["max_abs_bias"]) == (mlp["noisy_label_mse"], mlp["max_abs_bias"])
        for row in (mlp, trees):
            line = next(line for line in report.splitlines() if line.startswith(f"| {row['mechanism']} · "
                                                                                 f"{row['model']} | "))
            assert f"{row['test_mse']:.2f}" in line
    bias = {r["mechanism"]: r["max_abs_bias"] for r in private}
    assert bias["laplace"] == bias["staircase"] == 0.0 and bias["opt-unbiased"] < 1e-9 and bias["rr-on-bins"] > 1.0
    # a release per mechanism (RR-on-Bins, biased, with its estimate rows released apart by opt-unbiased), and
    # auto's two parts and central mean: the trees' jobs charged nothing more, and every example ε per job
    assert "8 privacy events, hash chain valid: True" in report
    assert "so each has spent Σε = 5; the labels party reports epsilon_spent = 5 of 5" in report  # the two agree
    assert "## auto: the trainer chooses" in report
    assert "The 4 gbdt jobs requested no release" in report
    # every head the service signed and exported still verifies against the database it left (both datasets: at
    # least their creation, upload-free facts and releases)
    heads = re.search(r"verify-audit` against the (\d+) Ed25519-signed chain heads the service exported: valid", report)
    assert heads is not None and int(heads.group(1)) >= 4 + 2, report


@pytest.mark.slow
def test_quick_demo_classification_round_accuracy_table_plot_and_audit(quick_demo):
    out, _ = quick_demo
    result = json.loads((out / demo_classification.RESULTS).read_text())
    epsilons, names = demo_classification.QUICK_EPSILONS, list(demo_classification.MECHANISMS)
    chance = 1 / demo_classification.NUM_CLASSES
    assert result["epsilons"] == epsilons
    private = [r for r in result["rows"] if r["epsilon"] is not None]
    cells = {(r["mechanism"], r["epsilon"]): r for r in private}
    assert len(private) == len(cells) == len(names) * len(epsilons)  # every mechanism x epsilon, once
    assert set(cells) == {(m, e) for m in names for e in epsilons}
    for (name, epsilon), row in cells.items():
        assert 0.0 <= row["test_accuracy"] <= 1.0 and 0.0 <= row["released_label_accuracy"] <= 1.0
        assert epsilon - 1e-6 < row["certified_epsilon"] <= epsilon
        # the job's release(s) — LP-2ST's two stages — and its estimate rows' release; cluster priors train on
        # an existing group release, which keeps no estimate rows
        assert len(row["release_ids"]) == {"LP-2ST": 3, "RR": 2, "RRWithPrior": 1}[name]
    top = max(epsilons)
    for name in names:  # at the largest epsilon, far above chance (1/10)
        assert cells[(name, top)]["test_accuracy"] > chance + 0.5, name
    for epsilon in epsilons:  # RR's released labels are right with probability e^eps / (e^eps + K - 1)
        expected = math.exp(epsilon) / (math.exp(epsilon) + demo_classification.NUM_CLASSES - 1)
        assert abs(cells[("RR", epsilon)]["released_label_accuracy"] - expected) < 0.05
    reference = next(r for r in result["rows"] if r["epsilon"] is None)
    assert reference["mechanism"] == "non-private" and reference["test_accuracy"] > 0.9

    assert (out / demo_classification.PLOT).read_bytes()[:8] == PNG
    report = (out / "results.md").read_text()
    assert "# Classification round: test accuracy" in report
    for name in names:
        line = next(line for line in report.splitlines() if line.startswith(f"| {name} | "))
        assert line.count("|") == len(epsilons) + 2
        assert f"{cells[(name, top)]['test_accuracy']:.3f}" in line

    # the audit of the digits dataset accounts for every classification release, at the epsilon requested
    events = {e["release_id"]: e for e in result["events"]}
    assert result["chain_valid"] is True
    assert len(result["events"]) == len(events) == sum(len(r["release_ids"]) for r in private)
    assert set(events) == {i for r in private for i in r["release_ids"]}
    for row in private:
        mine = [events[i] for i in row["release_ids"]]
        assert all(e["charge"] == pytest.approx(row["epsilon"], abs=1e-9) for e in mine)
        # training examples only, once — but for LP-2ST's stage-2 examples whose prior keeps one class, which are
        # neither charged nor released
        uncharged = row["uninformative_examples"]
        assert uncharged == 0 or row["mechanism"] == "LP-2ST"
        assert sum(e["examples_covered"] for e in mine) + uncharged == result["num_train"]
        assert row["charged_epsilon_per_example"] == pytest.approx(
            row["epsilon"] * (1 - uncharged / result["num_train"]), abs=1e-9)
    covered = sum(r["epsilon"] * (result["num_train"] - r["uninformative_examples"]) for r in private)
    charged = sum(e["charge"] * e["examples_covered"] for e in result["events"])
    assert charged == pytest.approx(covered, abs=1e-6)
    requested = len(names) * sum(epsilons)
    assert result["epsilon_spent"] == pytest.approx(requested, abs=1e-9)  # most examples: all of it
    assert result["epsilon_total"] == pytest.approx(requested, abs=1e-9)
    assert (f"epsilon_spent = {requested:g} of {requested:g}" in report
            and f"{len(result['events'])} privacy events on the digits dataset" in report)


def test_the_demo_takes_services_it_did_not_start_with_keys_from_a_private_file(tmp_path):
    """``labeldp demo --labels-url … --trainer-url … --keys-file F`` (what runs against a compose stack): the keys
    file must be the user's alone and name the three keys; the URLs are used as given."""
    from labeldp.demo import external_services
    from shared.errors import LabelDPError

    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"admin": "a-key", "consumer": "c-key", "trainer": "t-key"}))
    keys.chmod(0o644)
    with pytest.raises(LabelDPError, match="may be read by others"):
        external_services("http://labels:8700", "http://trainer:8701", keys)
    keys.chmod(0o600)
    with external_services("http://labels:8700/", "http://trainer:8701", keys)(tmp_path) as running:
        assert (running.labels_url, running.trainer_url) == ("http://labels:8700", "http://trainer:8701")
        assert (running.admin_key, running.consumer_key, running.trainer_key) == ("a-key", "c-key", "t-key")
        assert running.sources is None and running.verify_audit() == {"valid": None}
    keys.write_text(json.dumps({"admin": "a-key"}))
    with pytest.raises(LabelDPError, match="admin, consumer and trainer"):
        external_services("http://labels:8700", "http://trainer:8701", keys)
