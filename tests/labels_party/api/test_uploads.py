"""Uploading labels: CSV, NDJSON and Parquet; bad files refused without a change; the size limit; re-uploads."""

from __future__ import annotations

import dataclasses
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from labels_party.http.api import create_app
from tests.labels_party.api.helpers import (
    NUM_LABELS,
    budget,
    created,
    expect_error,
    labels_csv,
    new_dataset,
    release,
    state,
    upload,
)

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


@pytest.mark.parametrize("fmt", ["csv", "ndjson", "parquet"])
def test_upload_formats(client, admin, labels, fmt):
    dataset_id = new_dataset(client, admin, name="weeks", label_kind="integer", min=1, max=52, epsilon_total=1)
    subset = dict(list(labels.items())[:300])
    if fmt == "csv":
        content, content_type = labels_csv(subset), "text/csv; charset=utf-8"
    elif fmt == "ndjson":
        content = "".join(json.dumps({"example_id": k, "label": v}) + "\n" for k, v in subset.items())
        content_type = "application/x-ndjson"
    else:
        content = _parquet_bytes(pa.table({"example_id": list(subset), "label": list(subset.values())}))
        content_type = "application/vnd.apache.parquet"
    r = upload(client, admin, dataset_id, content, content_type)
    assert r.status_code == 200, r.text
    assert r.json() == {"dataset_id": dataset_id, "label_version": 1, "num_examples": 300, "new_examples": 300,
                        "clipped_below": 0, "clipped_above": 0, "warnings": []}
    d = client.get(f"/v1/datasets/{dataset_id}", headers=admin).json()
    assert (d["label_version"], d["num_examples"]) == (1, 300)


BAD_UPLOADS = {
    "out-of-domain": ("example_id,label\na,1\nb,53\n", "text/csv", 400, "label_out_of_domain"),
    "fractional": ("example_id,label\na,1\nb,2.5\n", "text/csv", 400, "label_out_of_domain"),
    "zero": ("example_id,label\na,0\n", "text/csv", 400, "label_out_of_domain"),
    "nan-csv": ("example_id,label\na,1\nb,NaN\n", "text/csv", 400, "malformed_file"),  # Arrow reads NaN as null
    "nan-ndjson": ('{"example_id":"a","label":1}\n{"example_id":"b","label":NaN}\n', "application/x-ndjson",
                   400, "label_out_of_domain"),
    "inf-csv": ("example_id,label\na,1\nb,inf\n", "text/csv", 400, "label_out_of_domain"),
    "minus-inf-csv": ("example_id,label\na,-inf\n", "text/csv", 400, "label_out_of_domain"),
    # NDJSON labels are JSON numbers (read as doubles in every block), so a quoted "inf" is malformed
    "inf-ndjson": ('{"example_id":"a","label":"inf"}\n', "application/x-ndjson", 400, "malformed_file"),
    "duplicate-ids": ("example_id,label\na,1\nb,2\na,3\n", "text/csv", 400, "duplicate_example_id"),
    "duplicate-ids-ndjson": ('{"example_id":"a","label":1}\n{"example_id":"a","label":1}\n',
                             "application/x-ndjson", 400, "duplicate_example_id"),
    "missing-label-ndjson": ('{"example_id":"a"}\n', "application/x-ndjson", 400, "malformed_file"),
    "missing-label-parquet": (_parquet_bytes(pa.table({"example_id": ["a"], "lbl": [1]})),
                              "application/vnd.apache.parquet", 400, "malformed_file"),
    "ragged-csv": ("example_id,label\na,1,7\nb,2\n", "text/csv", 400, "malformed_file"),
    "non-numeric-csv": ("example_id,label\na,one\n", "text/csv", 400, "malformed_file"),
    "empty-label-csv": ("example_id,label\na,\n", "text/csv", 400, "malformed_file"),
    "empty-id-csv": ("example_id,label\n,1\n", "text/csv", 400, "malformed_file"),
    "garbage-parquet": (b"PAR1 this is not parquet", "application/vnd.apache.parquet", 400, "malformed_file"),
    "not-json-ndjson": ("{example_id: a}\n", "application/x-ndjson", 400, "malformed_file"),
    "empty-csv": ("", "text/csv", 400, "malformed_file"),
    "empty-ndjson": ("", "application/x-ndjson", 400, "malformed_file"),
    "empty-parquet": (b"", "application/vnd.apache.parquet", 400, "malformed_file"),
    "header-only-csv": ("example_id,label\n", "text/csv", 400, "empty_labels"),
    "unsupported-type": ("example_id,label\na,1\n", "image/png", 415, "unsupported_media_type"),
    "no-content-type": ("example_id,label\na,1\n", "", 415, "unsupported_media_type"),
}
BAD_UPLOAD_PARAMS = [pytest.param(*v, id=k) for k, v in BAD_UPLOADS.items()] + [
    pytest.param("example_id,lab\na,1\n", "text/csv", 400, "malformed_file", id="missing-label-csv"),
    pytest.param("example_id\na\n", "text/csv", 400, "malformed_file", id="id-column-only-csv"),
]


@pytest.mark.parametrize("content, content_type, status, code", BAD_UPLOAD_PARAMS)
def test_bad_upload_is_refused_and_changes_nothing(client, admin, dataset, content, content_type, status, code):
    before = state(client, admin, dataset)
    assert before["label_version"] == 1
    r = upload(client, admin, dataset, content, content_type)
    assert state(client, admin, dataset) == before
    expect_error(r, status, code)


def test_upload_over_the_limit_is_413(ctx, admin, dataset, labels):
    limited = dataclasses.replace(ctx, settings=ctx.settings.model_copy(update={"max_upload_bytes": 1000}))
    small = TestClient(create_app(limited), raise_server_exceptions=False)
    before = state(small, admin, dataset)
    body = labels_csv(labels)
    assert len(body) > 1000
    expect_error(upload(small, admin, dataset, body), 413, "body_too_large")

    def chunks():  # no Content-Length: the limit is enforced while streaming
        for start in range(0, len(body), 256):
            yield body[start:start + 256].encode()
    expect_error(upload(small, admin, dataset, chunks()), 413, "body_too_large")
    assert state(small, admin, dataset) == before
    r = upload(small, admin, dataset, "example_id,label\ne0,7\ne1,8\n")  # under the limit: accepted
    assert r.status_code == 200 and r.json()["label_version"] == 2 and r.json()["num_examples"] == 2


def test_reupload_creates_new_version_and_leaves_releases_untouched(client, admin, consumer, dataset, labels):
    first = created(release(client, consumer, dataset, "before", mechanism="laplace", epsilon=0.5))
    assert first["label_version"] == 1
    before_bytes = client.get(f"/v1/releases/{first['id']}/labels", headers=consumer).content
    before_parquet = client.get(f"/v1/releases/{first['id']}/labels",
                                headers={**consumer, "Accept": "application/vnd.apache.parquet"}).content

    changed = {k: (v % 52) + 1 for k, v in labels.items()}
    r = upload(client, admin, dataset, labels_csv(changed))
    assert r.status_code == 200, r.text
    assert r.json() == {"dataset_id": dataset, "label_version": 2, "num_examples": NUM_LABELS, "new_examples": 0,
                        "clipped_below": 0, "clipped_above": 0, "warnings": []}
    d = client.get(f"/v1/datasets/{dataset}", headers=admin).json()
    assert (d["label_version"], d["num_examples"]) == (2, NUM_LABELS)
    assert budget(client, admin, dataset)["epsilon_spent"] == 0.5  # re-uploading charges and refunds nothing

    assert client.get(f"/v1/releases/{first['id']}/labels", headers=consumer).content == before_bytes
    assert client.get(f"/v1/releases/{first['id']}/labels",
                      headers={**consumer, "Accept": "application/vnd.apache.parquet"}).content == before_parquet
    assert client.get(f"/v1/releases/{first['id']}", headers=consumer).json()["label_version"] == 1
    second = created(release(client, consumer, dataset, "after", mechanism="laplace", epsilon=0.5))
    assert second["label_version"] == 2
    assert budget(client, admin, dataset)["epsilon_spent"] == 1.0
