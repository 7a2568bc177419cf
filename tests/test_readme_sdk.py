"""The README's quickstart and the Python SDK tutorial (docs/tutorials/python-sdk.md) run as written against both
services started as processes (as their commands start them): the quickstart's auto job; then the tutorial's dataset
from a DataFrame, a job holding 20 % out by a hashed split, a release of the held-out labels, and the unbiased
test-MSE estimate from its mechanism document — checked against the true held-out MSE, which only this test,
playing both parties, can compute."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from labeldp.local_services import free_port, serve_process
from tests.support.readme import DOCS, README, readme_block

TUTORIAL = DOCS / "tutorials" / "python-sdk.md"


def sdk_block() -> str:
    return readme_block("python-sdk", "python", TUTORIAL)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "labeldp", *args]


@pytest.fixture()
def services(tmp_path, monkeypatch):
    """The README's commands: three keys and both services, each party with a database of its own."""
    labels_db = ["--database-url", f"sqlite:///{tmp_path / 'labels.db'}", "--data-dir", str(tmp_path / "labels")]
    trainer_db = ["--database-url", f"sqlite:///{tmp_path / 'trainer.db'}", "--data-dir", str(tmp_path / "trainer")]

    def key(party: str, org: str, role: str, database: list[str]) -> str:
        return subprocess.run(_cli(party, "create-key", "--org", org, "--role", role, *database), check=True,
                              capture_output=True, text=True).stdout.strip()

    labels_url, trainer_url = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    with serve_process(_cli("labels", "serve", "--port", labels_url.rsplit(":", 1)[1], *labels_db), labels_url,
                       log=tmp_path / "labels.log"), \
            serve_process(_cli("features", "serve", "--port", trainer_url.rsplit(":", 1)[1], *trainer_db,
                               "--labels-party", f"shop={labels_url}"), trainer_url, log=tmp_path / "trainer.log"):
        monkeypatch.setenv("OWNER_KEY", key("labels", "shop", "admin", labels_db))
        monkeypatch.setenv("PUBLISHER_KEY", key("labels", "publisher", "consumer", labels_db))
        monkeypatch.setenv("TRAINER_KEY", key("features", "publisher", "admin", trainer_db))
        monkeypatch.setenv("LABELS_URL", labels_url)
        monkeypatch.setenv("TRAINER_URL", trainer_url)
        yield


@pytest.mark.slow
def test_the_quickstart_and_the_sdk_tutorial_run_as_written(services: None,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from shared.splits import holdout_mask  # the trainer's split (hashed on example ids)

    quickstart: dict = {"__name__": "readme_quickstart"}
    exec(compile(readme_block("quickstart", "python"), str(README) + ":quickstart", "exec"), quickstart)
    first = quickstart["job"]
    assert first.status == "succeeded" and first.release["certified_epsilon"] <= 1.0
    assert sum(part["num_examples"] for part in first.release["parts"].values()) == 22_272  # each example once
    assert first.auto["chosen"]["candidate"] in capsys.readouterr().out

    namespace: dict = {"__name__": "readme_sdk"}
    exec(compile(sdk_block(), str(TUTORIAL) + ":python-sdk", "exec"), namespace)
    table, job, predictions = namespace["table"], namespace["job"], namespace["predictions"]
    estimate, noisy, release = namespace["estimate"], namespace["noisy"], namespace["release"]

    # The job held out exactly the examples the hashed split names, trained on the others, and charged only them.
    expected = table.example_id[holdout_mask(table.example_id.tolist(), 0.2, 7)]
    held_out = predictions.example_id[predictions.holdout]
    assert sorted(held_out) == sorted(expected) and job.num_holdout_examples == len(expected)
    assert 0.18 < len(expected) / len(table) < 0.22
    # the auto job released each training example once, in one of its parts, and none held out
    parts = job.release["parts"]
    assert sum(part["num_examples"] for part in parts.values()) == len(table) - len(expected) and len(table) == 22_272
    assert job.release["mean"]["num_examples"] == len(table) - len(expected)
    assert job.release["certified_epsilon"] <= 1.0
    assert release.num_examples == len(noisy) == estimate.num_examples == len(expected)
    # auto chose a model over the constant; the job warns exactly when its own estimate (1,820 noisy labels at ε = 1)
    # cannot show the model beats the constant — which the held-out truth below settles either way
    assert job.auto["chosen"]["candidate"] != "constant"
    assert bool(job.warnings) == (not job.estimate["better"])
    assert all("better than the constant predictor" in warning for warning in job.warnings)

    # The estimate is within 4 of its standard errors of the true held-out MSE (a 6·10⁻⁵ chance otherwise), and its
    # interval is the normal one at 95 % widened by its bias bound (integer labels under opt-unbiased: no rounding).
    truth_of = table.set_index("example_id").hours.astype(float)
    predicted = predictions.set_index("example_id").prediction
    truth = float(np.mean((predicted[expected] - truth_of[expected]) ** 2))
    assert abs(estimate.estimate - truth) < 4 * estimate.standard_error
    low, high = estimate.confidence_interval
    assert estimate.rounding_bound == 0.0
    assert (high - low) / 2 == pytest.approx(1.959964 * estimate.standard_error + estimate.bias_bound)
    assert truth < 0.9 * float(np.var(truth_of[expected]))  # the model learned something from the features
    assert f"{job.num_holdout_examples} held out; its own estimate" in capsys.readouterr().out
