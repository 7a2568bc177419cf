"""The error envelope's last line against server paths (issue 26): a message that names a file under the data
directory or the temporary directory reaches the client with ``<file>`` instead; other text is left alone."""

from __future__ import annotations

import logging
import tempfile

from fastapi import FastAPI
from fastapi.testclient import TestClient

from shared.errors import LabelDPError, library_message
from shared.service.errors import install_error_handlers
from tests.support.paths import assert_path_free


def _client(data_dir) -> TestClient:
    app = FastAPI()
    install_error_handlers(app, logging.getLogger("test"), [data_dir])

    @app.get("/refuse/{which}")
    def refuse(which: str):
        message = {"data": f"cannot read {data_dir}/tmp/spool/1-x/body-y/body: truncated",
                   "relative": "cannot read var/data/releases/r.parquet",
                   "temporary": f"see '{tempfile.gettempdir()}/labeldp-body-x/body'",
                   "clean": "labels need columns example_id and label (got x/y, 1/2)"}[which]
        raise LabelDPError(message, code="malformed_file")

    return TestClient(app, raise_server_exceptions=False)


def test_the_envelope_replaces_private_paths(tmp_path):
    client = _client(tmp_path / "data")
    for which, expected in [("data", "cannot read <file>: truncated"), ("temporary", "see '<file>'"),
                            ("clean", "labels need columns example_id and label (got x/y, 1/2)")]:
        response = client.get(f"/refuse/{which}")
        assert response.status_code == 400
        assert response.json() == {"error": {"code": "malformed_file", "message": expected}}
        assert_path_free(response.json()["error"]["message"], tmp_path)


def test_a_relative_data_directory_is_replaced_as_given():
    response = _client("var/data").get("/refuse/relative")
    assert response.json()["error"]["message"] == "cannot read <file>"


def test_library_messages_lose_paths_not_meaning():
    assert library_message(OSError("Could not open Parquet input source '<Buffer>': Parquet file size is 0 bytes")) \
        == "Parquet file size is 0 bytes"
    assert library_message(ValueError("Failed to open local file '/srv/data/tmp/x/body'. Detail: [errno 2]\nmore")) \
        == "Failed to open local file '<file>'. Detail: [errno 2]"
    assert library_message(ValueError("JSON parse error: Column(/label) changed from number to string")) \
        == "JSON parse error: Column(/label) changed from number to string"
    assert library_message(ValueError("")) == "ValueError"
