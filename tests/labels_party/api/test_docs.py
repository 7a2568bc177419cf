"""Documentation: /docs and the OpenAPI document list every route; an unknown route is a JSON 404."""

from __future__ import annotations

import pytest

from tests.labels_party.api.helpers import expect_error

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")


def test_docs_and_openapi(client):
    assert client.get("/docs").status_code == 200
    r = client.get("/openapi.json")
    assert r.status_code == 200
    paths = r.json()["paths"]
    for path in ("/v1/datasets", "/v1/datasets/{dataset_id}/labels", "/v1/datasets/{dataset_id}/releases",
                 "/v1/datasets/{dataset_id}/budget", "/v1/datasets/{dataset_id}/grants",
                 "/v1/releases/{release_id}/labels", "/v1/audit"):
        assert path in paths


def test_unknown_route_is_json_404(client, admin):
    expect_error(client.get("/v1/nothing-here", headers=admin), 404, "not_found")
