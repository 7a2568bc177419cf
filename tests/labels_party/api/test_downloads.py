"""Downloading a release's labels: CSV, NDJSON, Parquet and JSON pages agree; other organizations get 404."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.labels_party.api.helpers import NUM_LABELS, created, download_rows, expect_error, release

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")


@pytest.fixture
def laplace_release(client, consumer, dataset):
    return created(release(client, consumer, dataset, "dl", mechanism="laplace", epsilon=2))


def test_download_csv(client, consumer, labels, laplace_release):
    r = client.get(f"/v1/releases/{laplace_release['id']}/labels", headers=consumer)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = download_rows(client, consumer, laplace_release["id"])
    assert len(rows) == NUM_LABELS == laplace_release["num_examples"]
    assert [i for i, _ in rows] == list(labels)
    assert all(math.isfinite(v) and v == round(v) for _, v in rows)  # discrete Laplace on integer labels


def test_download_ndjson_and_parquet_match_csv(client, consumer, laplace_release):
    rows = download_rows(client, consumer, laplace_release["id"])
    r = client.get(f"/v1/releases/{laplace_release['id']}/labels",
                   headers={**consumer, "Accept": "application/x-ndjson"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    lines = r.text.splitlines()
    assert len(lines) == NUM_LABELS
    objects = [json.loads(line) for line in lines]
    assert all(set(o) == {"example_id", "label"} for o in objects)
    assert [(o["example_id"], o["label"]) for o in objects] == rows

    r = client.get(f"/v1/releases/{laplace_release['id']}/labels",
                   headers={**consumer, "Accept": "application/vnd.apache.parquet"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/vnd.apache.parquet")
    table = pq.read_table(io.BytesIO(r.content))
    assert table.num_rows == NUM_LABELS
    assert list(zip(table.column("example_id").to_pylist(), table.column("label").to_pylist(), strict=True)) == rows


def test_download_json_pages(client, consumer, laplace_release):
    rows = download_rows(client, consumer, laplace_release["id"])
    items, offset, pages = [], 0, 0
    while offset is not None:
        r = client.get(f"/v1/releases/{laplace_release['id']}/labels", params={"limit": 700, "offset": offset},
                       headers={**consumer, "Accept": "application/json"})
        assert r.status_code == 200, r.text
        page = r.json()
        assert page["total"] == NUM_LABELS and page["offset"] == offset
        assert len(page["items"]) == min(700, NUM_LABELS - offset)
        items += page["items"]
        offset = page["next_offset"]
        pages += 1
    assert pages == 3
    assert [(i["example_id"], i["label"]) for i in items] == rows
    beyond = client.get(f"/v1/releases/{laplace_release['id']}/labels", params={"offset": 5000},
                        headers={**consumer, "Accept": "application/json"}).json()
    assert beyond == {"items": [], "offset": 5000, "total": NUM_LABELS, "next_offset": None}
    for params in ({"limit": 0}, {"offset": -1}, {"limit": 100_001}):
        expect_error(client.get(f"/v1/releases/{laplace_release['id']}/labels", params=params,
                                headers={**consumer, "Accept": "application/json"}), 422, "invalid_request")


def test_download_unsupported_accept_is_406(client, consumer, laplace_release):
    for accept in ("image/png", "application/xml, text/html"):
        expect_error(client.get(f"/v1/releases/{laplace_release['id']}/labels",
                                headers={**consumer, "Accept": accept}), 406, "not_acceptable")


def test_download_by_other_org_is_404(client, admin, stranger, other_admin, laplace_release):
    release_id = laplace_release["id"]
    missing = expect_error(client.get(f"/v1/releases/{'f' * 32}/labels", headers=stranger), 404, "not_found")
    for headers in (stranger, other_admin):
        error = expect_error(client.get(f"/v1/releases/{release_id}/labels", headers=headers), 404, "not_found")
        assert error == missing  # does not reveal that the release exists
        expect_error(client.get(f"/v1/releases/{release_id}", headers=headers), 404, "not_found")
    # The owning admin can read it.
    assert client.get(f"/v1/releases/{release_id}/labels", headers=admin).status_code == 200


def test_laplace_release_is_unbiased(client, consumer, labels, laplace_release):
    noisy = dict(download_rows(client, consumer, laplace_release["id"]))
    assert noisy.keys() == labels.keys()
    ids = list(labels)
    truth = np.array([labels[i] for i in ids], dtype=float)
    released = np.array([noisy[i] for i in ids])
    standard_error = released.std(ddof=1) / math.sqrt(len(ids))
    assert released.std() > 2 * truth.std()  # it really is noisy (noise std ≈ 36 vs label std ≈ 15)
    assert abs(released.mean() - truth.mean()) < 5 * standard_error
