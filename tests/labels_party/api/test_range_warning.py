"""The owner's warning at upload (issue 39): a declared range far wider than the labels' middle 90 % is named, with
the labels' bulk, in the upload's answer to the owner — nothing is released, nothing charged."""

from __future__ import annotations

import numpy as np
import pytest

from labels_party.releases.datasets import WIDE_RANGE, range_warning
from shared.domains import ContinuousInterval, integer_range
from tests.labels_party.api.helpers import admin_client


def _upload(client, dataset: str, labels) -> dict:
    body = "example_id,label\n" + "\n".join(f"e{i},{float(v)!r}" for i, v in enumerate(labels))
    response = client.put(f"/v1/datasets/{dataset}/labels", content=body, headers={"Content-Type": "text/csv"})
    assert response.status_code == 200, response.text
    return response.json()


def test_heavy_tailed_labels_on_a_wide_range_are_warned_about_and_nothing_is_spent(tmp_path):
    _, client = admin_client(tmp_path)
    wealth = np.round(np.exp(np.random.default_rng(1).normal(3, 1.2, size=3000)), 2)  # median 20, max ~ 1e3
    wide = client.post("/v1/datasets", json={"name": "wealth", "label_kind": "continuous", "min": 0,
                                             "max": 100_000, "epsilon_total": 1}).json()["id"]
    answer = _upload(client, wide, wealth)
    assert len(answer["warnings"]) == 1
    low, high = np.quantile(wealth, [0.05, 0.95])
    message = answer["warnings"][0]
    assert message.startswith("the declared range [0, 100000] is") and "wider than the middle 90 %" in message
    ratio = float(message.split(" is ")[1].split(" times")[0].replace(",", ""))
    assert ratio == pytest.approx(100_000 / (high - low), rel=0.05)  # DuckDB's t-digest: approximate quantiles
    assert client.get(f"/v1/datasets/{wide}/budget").json()["epsilon_spent"] == 0.0
    narrow = client.post("/v1/datasets", json={"name": "hours", "label_kind": "integer", "min": 0, "max": 60,
                                               "epsilon_total": 1}).json()["id"]
    assert _upload(client, narrow, np.arange(3000) % 61)["warnings"] == []


def test_the_rule():
    domain = integer_range(0, 1000)
    assert range_warning(domain, (10.0, 10.0 + 1000 / WIDE_RANGE)) is None  # exactly the limit
    assert "wider than the middle 90 %" in range_warning(domain, (10.0, 10.0 + 1000 / WIDE_RANGE - 1))
    assert "infinitely wider" in range_warning(ContinuousInterval(0, 5, 11), (1.0, 1.0))
    assert range_warning(domain, None) is None  # class labels: no bulk
