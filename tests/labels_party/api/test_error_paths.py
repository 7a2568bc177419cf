"""Malformed columnar bodies (label uploads, per-example priors, groups) are 4xx refusals that say what is wrong
with the file, never where the service keeps it (issue 26): no data directory, no temporary directory, no absolute
path in any message — and never a 500 (bad UTF-8 in NDJSON, list or struct columns, non-numeric priors were)."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.labels_party.api.helpers import expect_error, labels_csv, new_dataset, state, upload
from tests.support.paths import assert_path_free

PARQUET = "application/vnd.apache.parquet"
NDJSON = "application/x-ndjson"


def _parquet(**columns) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue()


GOOD = _parquet(example_id=["a", "b"], label=[1.0, 2.0], p_0=[0.5, 0.5], p_1=[0.5, 0.5], p_2=[0.0, 0.0],
                group=["x", "y"])
BODIES = {
    "truncated-parquet": (GOOD[:len(GOOD) // 2], PARQUET),
    "parquet-without-footer": (GOOD[:-3], PARQUET),
    "parquet-header-only": (b"PAR1", PARQUET),
    "garbage-parquet": (b"PAR1 not parquet at all PAR1", PARQUET),
    "empty-parquet": (b"", PARQUET),
    "parquet-wrong-columns": (_parquet(x=["a"], y=[1]), PARQUET),
    "parquet-string-values": (_parquet(example_id=["a"], label=["one"], p_0=["x"], p_1=["y"], p_2=["z"],
                                       group=[None]), PARQUET),
    "parquet-list-values": (_parquet(example_id=["a"], label=[[1.0]], p_0=[[1.0]], p_1=[[1.0]], p_2=[[1.0]],
                                     group=[[1]]), PARQUET),
    "csv-bad-utf8": (b"example_id,label,p_0,p_1,p_2,group\n\xff\xfe,1,1,1,1,g\n", "text/csv"),
    "csv-non-numeric": (b"example_id,label,p_0,p_1,p_2,group\na,one,x,y,z,g\n", "text/csv"),
    "csv-ragged": (b"example_id,label\na,1,7\n", "text/csv"),
    "csv-wrong-columns": (b"x,y\na,1\n", "text/csv"),
    "csv-empty": (b"", "text/csv"),
    "ndjson-not-json": (b"{example_id: a}\n", NDJSON),
    "ndjson-bad-utf8-id": (b'{"example_id":"\xff","label":1,"p_0":1,"p_1":1,"p_2":1,"group":"g"}\n', NDJSON),
    "ndjson-bad-utf8-group": (b'{"example_id":"a","label":1,"p_0":1,"p_1":1,"p_2":1,"group":"\xff"}\n', NDJSON),
    "ndjson-non-numeric": (b'{"example_id":"a","label":"one","p_0":"x","p_1":1,"p_2":1,"group":"g"}\n', NDJSON),
    "ndjson-nested": (b'{"example_id":"a","label":[1],"p_0":[1],"p_1":1,"p_2":1,"group":{"k":1}}\n', NDJSON),
    "ndjson-empty": (b"", NDJSON),
}


ROUTES = ("labels", "prior-releases", "group-releases")
# Bodies a route reads as valid: the groups route reads only example_id and group, the others never read group.
VALID_FOR = {"ndjson-bad-utf8-group": {"labels", "prior-releases"},
             "csv-non-numeric": {"group-releases"}, "ndjson-non-numeric": {"group-releases"}}
CASES = [(route, name) for route in ROUTES for name in BODIES if route not in VALID_FOR.get(name, ())]


@pytest.fixture
def classes(client, admin):
    """Classes 0..2 with labels (priors and groups need them), ε_total = 5."""
    dataset = new_dataset(client, admin, name="classes", label_kind="classes", num_classes=3, epsilon_total=5)
    assert upload(client, admin, dataset, labels_csv({"a": 0, "b": 1, "c": 2})).status_code == 200
    return dataset


@pytest.mark.parametrize(("route", "name"), CASES)
def test_malformed_bodies_are_refused_without_a_path(client, admin, data_dir, classes, route, name):
    body, content_type = BODIES[name]
    before = state(client, admin, classes)
    headers = {**admin, "Content-Type": content_type, "Idempotency-Key": f"{route}-{name}"}
    if route == "labels":
        response = client.put(f"/v1/datasets/{classes}/labels", content=body, headers=headers)
    else:
        query = {"epsilon": 1} if route == "prior-releases" else {
            "mechanism": "rr-with-prior", "epsilon": 1, "prior_epsilon": 0.5}
        response = client.post(f"/v1/datasets/{classes}/{route}", params=query, content=body, headers=headers)
    # which refusal depends on the body (a file without the columns, or without rows); a 500 never
    assert 400 <= response.status_code < 500, response.text
    error = expect_error(response, response.status_code, response.json()["error"]["code"])
    assert error["code"] in {"malformed_file", "empty_labels", "invalid_prior", "label_out_of_domain"}, error
    assert_path_free(error["message"], data_dir)
    assert state(client, admin, classes) == before


def test_what_is_wrong_is_still_said(client, admin, classes):
    """Path-free, not content-free: the message names the problem."""
    cases = [("labels", BODIES["truncated-parquet"], "magic bytes"),
             ("prior-releases", BODIES["empty-parquet"], "0 bytes"),
             ("labels", BODIES["ndjson-bad-utf8-id"], "UTF8"),
             ("prior-releases", BODIES["csv-non-numeric"], "'x'")]
    for route, (body, content_type), words in cases:
        headers = {**admin, "Content-Type": content_type, "Idempotency-Key": words}
        response = client.put(f"/v1/datasets/{classes}/labels", content=body, headers=headers) \
            if route == "labels" else client.post(f"/v1/datasets/{classes}/{route}", params={"epsilon": 1},
                                                  content=body, headers=headers)
        assert words in expect_error(response, 400, "malformed_file")["message"], response.text
